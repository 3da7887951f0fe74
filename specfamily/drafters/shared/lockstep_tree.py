"""EAGLE-2 top-k trees for a batch of slots in fixed shapes: :func:`~.dynamic_tree.grow_tree`'s trees, grown
without reading the device until the kept trees cross to the host in one copy (eagle, eagle3 in batches).

``grow_tree`` decides on the host what each depth feeds (the expandable nodes, an early stop) and closes the kept set
in a loop, each a wait for an accelerator. Here every slot feeds exactly ``top_k`` nodes a depth, every depth up to
its own: the k nodes ``grow_tree`` would feed, best first, then ``top_k - k`` dead ones, whose children are invalid
(never fed as live nodes, never kept). Candidate j of a depth's block is child ``j % top_k`` of the block's
``j // top_k``-th fed node, so valid candidates keep ``grow_tree``'s generation order with the dead ones interleaved,
and every ordering by (valid, score, index) ranks the valid ones as ``grow_tree`` ranks them, ties included: the kept
tree is the same. A top-k tree's kept set needs no closing (a child's score never exceeds its parent's or an earlier
sibling's, which come first in index order); :func:`select_lockstep` reports a kept node whose parent or earlier
sibling is not kept, in the same copy, instead of closing the set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specfamily.core.host import to_host
from specfamily.core.types import Draft

__all__ = ["KeptTrees", "LockstepStep", "grow_lockstep", "kept_drafts", "select_lockstep"]

# step(active slots, nodes (B, k), tokens (B, k), parents (B, k)) -> the fed nodes' rows (A, k, V), one per active
# slot in that order (log-probabilities); nodes and parents are candidate indices (parents -1: the root).
LockstepStep = Callable[[list[int], torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Candidates:
    """Every slot's candidates in generation order, fixed shape (B, n); ``valid`` False for a dead node's child."""

    tokens: torch.Tensor  # (B, n) long
    parents: torch.Tensor  # (B, n) long, -1 for the root's children
    scores: torch.Tensor  # (B, n)
    valid: torch.Tensor  # (B, n) bool

    def grow(self, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor) -> None:
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.parents = torch.cat([self.parents, parents], dim=1)
        self.scores = torch.cat([self.scores, scores], dim=1)
        self.valid = torch.cat([self.valid, valid], dim=1)


@dataclass
class KeptTrees:
    """Every slot's kept tree, padded to (B, width): slot b's first ``counts[b]`` nodes, parents indexing its kept
    nodes (-1: the root); ``open`` (B,) True where the kept set was not closed (never for a top-k tree)."""

    tokens: torch.Tensor  # (B, width) long, draft-vocabulary indices
    parents: torch.Tensor  # (B, width) long
    counts: torch.Tensor  # (B,) long
    open: torch.Tensor  # (B,) bool


def best_first(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(B, n) each row's candidate indices ordered valid first, then by score descending, ties to the lower index."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    invalid = (~valid).gather(-1, order).to(torch.uint8)
    return order.gather(-1, torch.sort(invalid, dim=-1, stable=True).indices)


def ranks(order: torch.Tensor) -> torch.Tensor:
    """(B, n) each candidate's place in ``order`` (0: first)."""
    places = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, places)


def choose(candidates: Candidates, last_start: int, top_k: int, limits: torch.Tensor,
           live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` nodes each slot feeds next: (nodes (B, k), ok (B, k)). ``grow_tree`` feeds the best ``top_k`` of
    the last depth among the best ``limits[b]`` (its total_tokens - 1) of everything so far; those come first here,
    ``ok``, the rest are dead. ``live`` (B,) False for a slot past its depth (nothing of it is ok)."""
    eligible = candidates.valid & (ranks(best_first(candidates.scores, candidates.valid)) < limits[:, None])
    last = best_first(candidates.scores[:, last_start:], eligible[:, last_start:])[:, :top_k]
    nodes = last + last_start
    return nodes, eligible.gather(-1, nodes) & live[:, None]


def expand(nodes: torch.Tensor, ok: torch.Tensor, scores: torch.Tensor, logp: torch.Tensor,
           top_k: int) -> tuple[torch.Tensor, ...]:
    """Every fed node's top-k children, (B, k * top_k) each: tokens, parents, scores (the node's score plus the
    child's log-probability, as ``dynamic_tree.expand``), valid (the node was ok)."""
    values, tokens = logp.topk(top_k, dim=-1)  # (B, k, top_k), most probable first
    node_scores = scores.gather(-1, nodes)
    children = (node_scores[..., None] + values.to(scores.dtype)).flatten(1)
    parents = nodes[..., None].expand_as(tokens).flatten(1)
    return tokens.flatten(1), parents, children, ok[..., None].expand_as(tokens).flatten(1)


def grow_lockstep(root_rows: torch.Tensor, depths: list[int], top_k: int, totals: list[int],
                  step: LockstepStep) -> KeptTrees:
    """Slot b's EAGLE-2 top-k tree of depth ``depths[b]`` keeping ``totals[b]`` nodes, as ``grow_tree`` grows it
    from the root's row ``root_rows[b]`` (log-probabilities over V >= top_k); one ``step`` call a depth for the
    slots still growing."""
    if top_k < 1 or top_k > root_rows.shape[-1] or min(depths) < 1 or min(totals) < 1:
        raise ValueError(f"top_k must be in 1..{root_rows.shape[-1]}, depths and totals >= 1; got top_k {top_k}, "
                         f"depths {depths}, totals {totals}")
    batch = root_rows.shape[0]
    shape = torch.tensor([depths, totals], dtype=torch.long).to(root_rows.device, non_blocking=True)  # queued
    values, tokens = root_rows.topk(top_k, dim=-1)  # depth 1: the root's children
    candidates = Candidates(tokens, torch.full_like(tokens, -1), values.to(torch.float32),
                            torch.ones_like(tokens, dtype=torch.bool))
    last_start = 0
    for depth in range(1, max(depths)):
        active = [b for b, d in enumerate(depths) if d > depth]
        nodes, ok = choose(candidates, last_start, top_k, shape[1] - 1, shape[0] > depth)
        rows = step(active, nodes, candidates.tokens.gather(-1, nodes), candidates.parents.gather(-1, nodes))
        last_start = candidates.tokens.shape[1]
        candidates.grow(*expand(nodes, ok, candidates.scores, _spread(rows, active, batch), top_k))
    return select_lockstep(candidates, shape[1], max(totals), top_k)


def _spread(rows: torch.Tensor, active: list[int], batch: int) -> torch.Tensor:
    """(B, k, V) the active slots' rows at their slots, zeros (never kept: their nodes are not ok) elsewhere."""
    if len(active) == batch:
        return rows
    zeros = rows.new_zeros(rows.shape[1:])
    by_slot = dict(zip(active, rows, strict=True))
    return torch.stack([by_slot.get(b, zeros) for b in range(batch)])


def select_lockstep(candidates: Candidates, totals: torch.Tensor, width: int, top_k: int) -> KeptTrees:
    """Each slot's ``totals[b]`` best valid candidates (ties to the lower index) in index order, parents remapped to
    kept nodes; padded to ``width`` (at least the largest total)."""
    kept = candidates.valid & (ranks(best_first(candidates.scores, candidates.valid)) < totals[:, None])
    n = kept.shape[1]
    width = min(width, n)
    order = torch.sort((~kept).to(torch.uint8), dim=-1, stable=True).indices[:, :width]  # kept first, by index
    counts = kept.sum(-1)
    real = torch.arange(width, device=kept.device) < counts[:, None]
    place = kept.cumsum(-1) - 1  # a kept candidate's index among its slot's kept nodes
    old = candidates.parents.gather(-1, order)
    has_parent = old >= 0
    parents = torch.where(has_parent, place.gather(-1, old.clamp(min=0)), -1)
    parent_kept = ~has_parent | kept.gather(-1, old.clamp(min=0))
    earlier = (order - 1).clamp(min=0)  # candidate j's earlier sibling is j - 1 unless j is a first child
    sibling_kept = (order % top_k == 0) | kept.gather(-1, earlier)
    open_ = (real & ~(parent_kept & sibling_kept)).any(-1)
    return KeptTrees(candidates.tokens.gather(-1, order), torch.where(real, parents, -1), counts, open_)


def kept_drafts(kept: KeptTrees, token_ids: Callable[[torch.Tensor], torch.Tensor]) -> list[Draft]:
    """Every slot's kept tree as a draft (q None: a top-k tree is deterministic), its target ids ``token_ids`` of the
    draft-vocabulary indices; all of them, and whether each is closed, read to the host in one copy."""
    tokens, parents, counts, open_ = to_host([token_ids(kept.tokens), kept.parents, kept.counts, kept.open])
    if open_.any():
        raise RuntimeError("a top-k tree kept a node without its parent or an earlier sibling")
    return [Draft(tokens[b, :n], parents[b, :n], None) for b, n in enumerate(counts.tolist())]
