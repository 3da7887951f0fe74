"""Speculation trees grown from a matched trie node, scored as in SuffixDecoding (Oliaro et al., NeurIPS 2025).

From the node of the longest matched suffix, every continuation seen in the trie is a candidate; a candidate's
probability is the product of the empirical continuation frequencies on its path (a child's count over the sum of
its siblings' counts). The tree grows greedily, most probable candidate first, while the probability stays at or
above ``min_token_prob``, up to ``max_spec_factor * match_length + max_spec_offset`` nodes (and ``max_tree_size``)
and ``depth`` levels. The tree's score is the sum of its nodes' probabilities: the expected number of accepted
tokens if the frequencies were the target's own. Chain mode takes the most frequent child at every level.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from specfamily.drafters.suffix.tree import ROOT, SuffixTrie


@dataclass
class Speculation:
    """A deterministic token tree (parents[i] < i, -1 under the root) and its score (sum of node probabilities)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_length: int = 0

    @property
    def score(self) -> float:
        return math.fsum(self.probs)

    def __len__(self) -> int:
        return len(self.tokens)


def spec_limit(match_length: int, max_spec_factor: float, max_spec_offset: float, max_tree_size: int) -> int:
    """How many tokens a match of ``match_length`` may propose: floor(factor * length + offset), capped, >= 0."""
    if match_length <= 0:
        return 0
    return max(0, min(max_tree_size, math.floor(max_spec_factor * match_length + max_spec_offset)))


def continuations(trie: SuffixTrie, node: int) -> list[tuple[float, int]]:
    """(frequency, child) of every child of ``node``, most frequent first (ties: smaller token first)."""
    children = list(trie.children(node))
    total = sum(trie.count[c] for c in children)
    ranked = sorted(children, key=lambda c: (-trie.count[c], trie.token[c]))
    return [(trie.count[c] / total, c) for c in ranked]


def grow(trie: SuffixTrie, node: int, limit: int, depth: int, min_prob: float, *, chain: bool = False,
         stop: frozenset[int] = frozenset()) -> Speculation:
    """The speculation tree below ``node`` (see the module docstring); nothing below a ``stop`` token."""
    match_length = trie.depth[node] if node != ROOT else 0
    out = Speculation(match_length=match_length)
    if node == ROOT or limit <= 0 or depth <= 0:
        return out
    heap: list[tuple[float, int, int, int, int]] = []  # (-prob, order, trie node, draft parent, level)
    order = 0

    def push(parent_node: int, draft_parent: int, prob: float, level: int) -> None:
        nonlocal order
        for freq, child in continuations(trie, parent_node)[: 1 if chain else None]:
            if prob * freq < min_prob:
                break  # sorted: the rest are less probable still
            heapq.heappush(heap, (-prob * freq, order, child, draft_parent, level))
            order += 1

    push(node, -1, 1.0, 1)
    while heap and len(out) < limit:
        neg, _, child, draft_parent, level = heapq.heappop(heap)
        out.tokens.append(trie.token[child])
        out.parents.append(draft_parent)
        out.probs.append(-neg)
        if level < depth and trie.token[child] not in stop:
            push(child, len(out) - 1, -neg, level + 1)
    return out


def better(first: Speculation, second: Speculation) -> Speculation:
    """The speculation with the higher score; on a tie the first (the request's own)."""
    return second if second.score > first.score else first
