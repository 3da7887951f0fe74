"""Speculation trees grown from a matched trie node, scored as in SuffixDecoding (Oliaro et al., NeurIPS 2025).

A candidate's probability is the product of the empirical continuation frequencies on its path (child count over
parent count). The tree grows most probable candidate first while that stays >= ``min_token_prob``, up to
``max_spec_factor * match_length + max_spec_offset`` nodes (and ``max_tree_size``) and ``depth`` levels; its score is
the sum of its nodes' probabilities. Chain mode takes the most frequent child at every level. :func:`best_match`
tries every matched suffix length and keeps the best-scored tree.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specfamily.drafters.suffix.tree import ROOT, SuffixTrie

if TYPE_CHECKING:
    from specfamily.drafters.suffix.automaton import SuffixIndex


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


def spec_limit(match_length: int, max_spec_factor: float, max_spec_offset: float | None, max_tree_size: int) -> int:
    """How many tokens a match of ``match_length`` may propose: floor(factor * length + offset), capped, >= 0; with
    no offset (None) the cap alone: the match length does not limit the tree."""
    if match_length <= 0:
        return 0
    if max_spec_offset is None:
        return max_tree_size
    return max(0, min(max_tree_size, math.floor(max_spec_factor * match_length + max_spec_offset + 1e-6)))


def continuations(trie: SuffixTrie | SuffixIndex, node: int, recency: bool = False,
                  min_freq: float = 0.0) -> list[tuple[float, int]]:
    """(frequency, child) of every child of ``node`` with a frequency of at least ``min_freq``: its count over the
    node's, most frequent first (ties: the smaller token first, or with ``recency`` the one that occurred last). The
    node's count includes occurrences with nothing after them yet, as ArcticInference counts."""
    total, count_of = trie.count_of(node), trie.count_of
    tie = (lambda c: -trie.recent_of(c)) if recency else trie.token_of
    least = min_freq * total * (1 - 1e-9)  # the frequency test on counts (kept below: the same float test decides)
    ranked = sorted((c for c in trie.children(node) if count_of(c) >= least), key=lambda c: (-count_of(c), tie(c)))
    return [(count_of(c) / total, c) for c in ranked]


def grow(trie: SuffixTrie | SuffixIndex, node: int, limit: int, depth: int, min_prob: float, *, chain: bool = False,
         stop: frozenset[int] = frozenset(), recency: bool = False) -> Speculation:
    """The speculation tree below ``node`` (see the module docstring); nothing below a ``stop`` token. With
    ``recency``, equally frequent continuations are ranked by how recently they occurred, and at equal probability
    a deeper node (one that continues a chosen path) comes before a new branch: when the counts cannot tell, the
    tree follows the latest occurrence, as prompt lookup does."""
    match_length = trie.depth_of(node) if node != ROOT else 0
    out = Speculation(match_length=match_length)
    if node == ROOT or limit <= 0 or depth <= 0:
        return out
    heap: list[tuple[float, int, int, int, int, int]] = []  # (-prob, -level or 0, order, node, draft parent, level)
    order = 0

    def push(parent_node: int, draft_parent: int, prob: float, level: int) -> None:
        nonlocal order
        floor = min_prob / prob if prob > 0 else 0.0
        for freq, child in continuations(trie, parent_node, recency, floor)[: 1 if chain else None]:
            if prob * freq < min_prob:
                break  # sorted: the rest are less probable still
            heapq.heappush(heap, (-prob * freq, -level if recency else 0, order, child, draft_parent, level))
            order += 1

    push(node, -1, 1.0, 1)
    while heap and len(out) < limit:
        neg, _, _, child, draft_parent, level = heapq.heappop(heap)
        token = trie.token_of(child)
        out.tokens.append(token)
        out.parents.append(draft_parent)
        out.probs.append(-neg)
        if level < depth and token not in stop:
            push(child, len(out) - 1, -neg, level + 1)
    return out


@dataclass(frozen=True)
class Limits:
    """How far a speculation may grow (see :func:`spec_limit` and :func:`grow`)."""

    max_spec_factor: float = 1.0
    max_spec_offset: float | None = 0.0
    max_tree_size: int = 16
    min_token_prob: float = 0.1
    chain: bool = False
    recency: bool = False  # break frequency ties by recency, and prefer a deeper node at equal probability


def best_match(trie: SuffixTrie | SuffixIndex, nodes: Iterable[int], depth: int, limits: Limits,
               stop: frozenset[int] = frozenset()) -> Speculation:
    """The best-scored speculation grown from any of ``nodes`` (matched suffixes, shortest first; a longer match
    wins a tie); nodes without children are skipped."""
    best = Speculation()
    for node in nodes:
        if node == ROOT or not trie.has_children(node):
            continue
        limit = spec_limit(trie.depth_of(node), limits.max_spec_factor, limits.max_spec_offset, limits.max_tree_size)
        spec = grow(trie, node, limit, depth, limits.min_token_prob, chain=limits.chain, stop=stop,
                    recency=limits.recency)
        if spec.tokens and spec.score >= best.score:
            best = spec
    return best


CHOICES = ("score", "match", "own")


def better(first: Speculation, second: Speculation, rule: str = "score") -> Speculation:
    """The request's own speculation (``first``) or the global one (``second``): ``score``: the higher score (the
    paper's rule); ``match``: the longer match, then the higher score; ``own``: the global one only when the
    request's own is empty. Ties go to the first."""
    if rule == "own":
        return first if first.tokens else second
    if rule == "match" and first.tokens and second.tokens and first.match_length != second.match_length:
        return first if first.match_length > second.match_length else second
    return second if second.score > first.score else first
