"""EAGLE-2 dynamic draft trees (Li et al. 2024b), as pure functions over log-probabilities (eagle, eagle3).

Expansion: the root's top-k children form depth 1. At each further depth the ``top_k`` most confident nodes of
the last depth (score = cumulative log-probability of the path from the root, i.e. the drafter's estimate of the
path's acceptance) are fed to the drafter in one batched call, and each gets its top-k children. After ``gamma``
depths, reranking keeps the ``total_tokens`` best nodes of everything generated. A child's score never exceeds its
parent's (log-probabilities are <= 0) and ties are broken by index (a parent precedes its children), so the kept
set is closed under ancestors; closure is enforced anyway. Siblings are distinct tokens (top-k), in decreasing
probability order; the proposal is deterministic (q = None), which the shared tree verifier handles exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# step(nodes, tokens, parents) -> (k, V) log-probabilities of the children of the fed nodes.
# nodes (k,): candidate indices being fed; tokens (k,): their tokens; parents (k,): their parent candidates (-1 root).
StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Candidates:
    """Every node generated so far, in generation order (a parent always precedes its children)."""

    tokens: torch.Tensor  # (n,) long
    parents: torch.Tensor  # (n,) long, candidate index of the parent, -1 for children of the root
    scores: torch.Tensor  # (n,) cumulative log-probability of the path root -> node

    def __len__(self) -> int:
        return self.tokens.numel()


@dataclass
class DraftTree:
    """The kept tree: ``parents`` index into the kept nodes (-1 = root's children), ``parents[i] < i``."""

    tokens: torch.Tensor  # (t,) long
    parents: torch.Tensor  # (t,) long
    scores: torch.Tensor  # (t,)


def expand(
    nodes: torch.Tensor, node_scores: torch.Tensor, logp: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k children of each node: (tokens, parents, scores), each (k_nodes * top_k,), siblings most probable first.

    nodes (k,) candidate indices (-1 = the root), node_scores (k,), logp (k, V).
    """
    values, tokens = logp.topk(min(top_k, logp.shape[-1]), dim=-1)  # (k, top_k), sorted
    scores = node_scores[:, None] + values.to(node_scores.dtype)
    parents = nodes[:, None].expand_as(tokens)
    return tokens.reshape(-1), parents.reshape(-1), scores.reshape(-1)


def most_confident(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k highest scores (all of them when fewer), best first; ties go to the lower index."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[:k]


def ancestor_closure(keep: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """(n,) bool: ``keep`` plus every ancestor of a kept node."""
    keep = keep.clone()
    while True:
        up = parents[keep]
        up = up[up >= 0]
        missing = up[~keep[up]]
        if missing.numel() == 0:
            return keep
        keep[missing] = True


def select_tree(candidates: Candidates, total_tokens: int) -> DraftTree:
    """The ``total_tokens`` best candidates by score (ties: lower index first), closed under ancestors, as a tree."""
    n = len(candidates)
    keep = torch.zeros(n, dtype=torch.bool, device=candidates.scores.device)
    keep[most_confident(candidates.scores, total_tokens)] = True
    keep = ancestor_closure(keep, candidates.parents)
    kept = keep.nonzero().squeeze(1)  # ascending: parents before children, siblings in drawn order
    remap = torch.full((n + 1,), -1, dtype=torch.long, device=kept.device)  # slot n stands for the root (-1)
    remap[kept] = torch.arange(kept.numel(), device=kept.device)
    old_parents = candidates.parents[kept]
    parents = remap[torch.where(old_parents < 0, n, old_parents)]
    return DraftTree(candidates.tokens[kept], parents, candidates.scores[kept])


def grow_tree(root_logp: torch.Tensor, step: StepFn, gamma: int, top_k: int, total_tokens: int) -> DraftTree:
    """EAGLE-2: expand up to ``gamma`` depths (at most ``gamma - 1`` calls of ``step``), keep the best ``total_tokens``.

    root_logp (V,): log-probabilities of the root's children; ``step`` feeds chosen nodes and returns their
    children's log-probabilities (k, V). A kept child ranks behind its parent, so only nodes already among the best
    ``total_tokens - 1`` can have kept children; the others are not expanded (same result, less drafter work, and
    growth stops early when no node qualifies).
    """
    if gamma < 1 or top_k < 1 or total_tokens < 1:
        raise ValueError(f"gamma, top_k and total_tokens must be >= 1, got {gamma}, {top_k}, {total_tokens}")
    root = torch.full((1,), -1, dtype=torch.long, device=root_logp.device)
    zero = torch.zeros(1, dtype=torch.float32, device=root_logp.device)
    tokens, parents, scores = expand(root, zero, root_logp[None], top_k)
    all_tokens, all_parents, all_scores = tokens, parents, scores
    last_start = 0
    for _ in range(gamma - 1):
        chosen = _expandable(all_scores, last_start, top_k, total_tokens)
        if chosen.numel() == 0:
            break
        logp = step(chosen, all_tokens[chosen], all_parents[chosen])  # (k, V)
        tokens, parents, scores = expand(chosen, all_scores[chosen], logp, top_k)
        last_start = all_tokens.numel()
        all_tokens = torch.cat((all_tokens, tokens))
        all_parents = torch.cat((all_parents, parents))
        all_scores = torch.cat((all_scores, scores))
    return select_tree(Candidates(all_tokens, all_parents, all_scores), total_tokens)


def _expandable(scores: torch.Tensor, last_start: int, top_k: int, total_tokens: int) -> torch.Tensor:
    """Candidates to feed next: the ``top_k`` best of the last depth among the best ``total_tokens - 1`` overall."""
    eligible = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    eligible[most_confident(scores, total_tokens - 1)] = True
    last = torch.arange(last_start, scores.numel(), device=scores.device)
    last = last[eligible[last_start:]]
    return last[most_confident(scores[last], top_k)]
