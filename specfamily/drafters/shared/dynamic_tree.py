"""EAGLE-2 dynamic draft trees (Li et al. 2024b), as pure functions over log-probabilities (eagle, eagle3).

Expansion: the root's top-k children form depth 1. At each further depth the ``top_k`` most confident nodes of
the last depth (score = cumulative log-probability of the path from the root, i.e. the drafter's estimate of the
path's acceptance) are fed to the drafter in one batched call, and each gets its top-k children. After ``gamma``
depths, reranking keeps the ``total_tokens`` best nodes of everything generated. A child's score never exceeds its
parent's (log-probabilities are <= 0) and ties are broken by index (a parent precedes its children), so the kept
set is closed under ancestors; closure is enforced anyway. Siblings are distinct tokens (top-k), in decreasing
probability order; the proposal is deterministic (q = None), which the shared tree verifier handles exactly.

Sampled trees (``expand_sampled``): each expanded node's children are drawn without replacement from its warped q,
in draw order, and the verifier is given each child's conditional q (``sibling_q``: the earlier siblings' tokens
zeroed, renormalised). For that to stay exact, whether a node is kept may depend on its ancestors, its earlier
siblings and other branches, never on its own token or anything drawn after it under its parent. So a child's score
is a *slot* score: its parent's score plus the log of the j-th largest q of the parent's row (what the top-k tree
would give the j-th child), fixed before the draw. Slot scores fall along draw order and with depth, ties go to
the lower (earlier) index, so the kept children of a node are a prefix of its draw order; ``select_tree`` closes
the kept set over earlier siblings as well as ancestors anyway, and ``is_draw_prefix`` checks it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch

# step(nodes, tokens, parents) -> (k, V) rows for the children of the fed nodes: log-probabilities (top-k trees)
# or warped probabilities q (sampled trees).
# nodes (k,): candidate indices being fed; tokens (k,): their tokens; parents (k,): their parent candidates (-1 root).
StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# expand(nodes (k,), node_scores (k,), rows (k, V)) -> children (tokens, parents, scores, ranks), each (c,), every
# node's children contiguous and in draw order (ranks 0, 1, ...).
ExpandFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


@dataclass
class Candidates:
    """Every node generated so far, in generation order (a parent always precedes its children)."""

    tokens: torch.Tensor  # (n,) long
    parents: torch.Tensor  # (n,) long, candidate index of the parent, -1 for children of the root
    scores: torch.Tensor  # (n,) cumulative log-probability of the path root -> node
    ranks: torch.Tensor  # (n,) long, position in the parent's draw order; a rank r > 0 node's earlier sibling is n - 1
    rows: torch.Tensor  # (n,) long, which expanded row (0: the root's, then one per fed node) the node was drawn from

    def __len__(self) -> int:
        return self.tokens.numel()


@dataclass
class DraftTree:
    """The kept tree: ``parents`` index into the kept nodes (-1 = root's children), ``parents[i] < i``."""

    tokens: torch.Tensor  # (t,) long
    parents: torch.Tensor  # (t,) long
    scores: torch.Tensor  # (t,)
    ranks: torch.Tensor  # (t,) long, position in the parent's draw order
    rows: torch.Tensor  # (t,) long, index into ``expanded`` of the row each node was drawn from
    expanded: list[torch.Tensor]  # the rows grow_tree expanded: the root's (1, V), then each step's (k, V)


# grow_tree_steps: yields (nodes, tokens, parents) of one step, is sent their rows (k, V), returns the tree.
TreeSteps = Generator[tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor, DraftTree]


def expand(
    nodes: torch.Tensor, node_scores: torch.Tensor, logp: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k children of each node: (tokens, parents, scores, ranks), each (k_nodes * top_k,), siblings most
    probable first.

    nodes (k,) candidate indices (-1 = the root), node_scores (k,), logp (k, V).
    """
    values, tokens = logp.topk(min(top_k, logp.shape[-1]), dim=-1)  # (k, top_k), sorted
    scores = node_scores[:, None] + values.to(node_scores.dtype)
    parents = nodes[:, None].expand_as(tokens)
    ranks = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    return tokens.reshape(-1), parents.reshape(-1), scores.reshape(-1), ranks.reshape(-1)


def expand_sampled(
    nodes: torch.Tensor, node_scores: torch.Tensor, q: torch.Tensor, top_k: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Children of each node drawn without replacement from its row of q (k, V), in draw order: (tokens, parents,
    scores, ranks). A row gives min(top_k, its support) children; child j's score is its parent's plus the log of
    the row's j-th largest probability (a slot score, independent of the token drawn: see the module docstring)."""
    out: list[list[torch.Tensor]] = [[], [], [], []]
    for node, score, row in zip(nodes, node_scores, q, strict=True):
        count = min(top_k, int((row > 0).sum()))
        if count == 0:
            continue
        tokens = torch.multinomial(row, count, replacement=False, generator=generator)  # sequential draw order
        slots = row.topk(count).values.log().to(node_scores.dtype)
        ranks = torch.arange(count, device=tokens.device)
        for part, value in zip(out, (tokens, node.expand(count), score + slots, ranks), strict=True):
            part.append(value)
    if not out[0]:
        empty = torch.zeros(0, dtype=torch.long, device=q.device)
        return empty, empty, node_scores.new_zeros(0), empty
    tokens, parents, scores, ranks = (torch.cat(part) for part in out)
    return tokens, parents, scores, ranks


def sibling_q(tokens: torch.Tensor, parents: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(t, V) each node's conditional q given its earlier siblings: ``rows`` (t, V), the distribution node i was
    drawn from, with the tokens of the nodes before i under the same parent zeroed, renormalised. Siblings must be in
    draw order (``is_draw_prefix``)."""
    t = tokens.numel()
    earlier = (parents[:, None] == parents[None, :]) & torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril(-1)
    node, sibling = earlier.nonzero(as_tuple=True)
    q = rows.double().clone()
    q[node, tokens[sibling]] = 0.0
    return q / q.sum(dim=-1, keepdim=True)


def is_draw_prefix(tree: DraftTree) -> bool:
    """Whether every node's kept children are ranks 0, 1, ... of its draw order, in that order."""
    seen: dict[int, int] = {}
    for parent, rank in zip(tree.parents.tolist(), tree.ranks.tolist(), strict=True):
        if rank != seen.get(parent, 0):
            return False
        seen[parent] = rank + 1
    return True


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


def sibling_closure(keep: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """(n,) bool: ``keep`` plus every earlier-drawn sibling of a kept node (candidate i - 1 when ranks[i] > 0)."""
    keep = keep.clone()
    while True:
        later = keep.nonzero().squeeze(1)
        earlier = later[ranks[later] > 0] - 1
        missing = earlier[~keep[earlier]]
        if missing.numel() == 0:
            return keep
        keep[missing] = True


def select_tree(candidates: Candidates, total_tokens: int, expanded: list[torch.Tensor] | None = None) -> DraftTree:
    """The ``total_tokens`` best candidates by score (ties: lower index first), closed under ancestors and earlier
    siblings, as a tree; ``expanded``: the rows the candidates were drawn from (``DraftTree.expanded``)."""
    n = len(candidates)
    keep = torch.zeros(n, dtype=torch.bool, device=candidates.scores.device)
    keep[most_confident(candidates.scores, total_tokens)] = True
    while True:
        closed = sibling_closure(ancestor_closure(keep, candidates.parents), candidates.ranks)
        if torch.equal(closed, keep):
            break
        keep = closed
    kept = keep.nonzero().squeeze(1)  # ascending: parents before children, siblings in drawn order
    remap = torch.full((n + 1,), -1, dtype=torch.long, device=kept.device)  # slot n stands for the root (-1)
    remap[kept] = torch.arange(kept.numel(), device=kept.device)
    old_parents = candidates.parents[kept]
    parents = remap[torch.where(old_parents < 0, n, old_parents)]
    return DraftTree(candidates.tokens[kept], parents, candidates.scores[kept], candidates.ranks[kept],
                     candidates.rows[kept], expanded or [])


def grow_tree(root_row: torch.Tensor, step: StepFn, gamma: int, top_k: int, total_tokens: int,
              expand_fn: ExpandFn | None = None) -> DraftTree:
    """EAGLE-2: expand up to ``gamma`` depths (at most ``gamma - 1`` calls of ``step``), keep the best ``total_tokens``.

    root_row (V,): the root's row (log-probabilities for the default top-k ``expand``; what ``expand_fn`` reads
    otherwise); ``step`` feeds chosen nodes and returns their rows (k, V). A kept child ranks behind its parent, so
    only nodes already among the best ``total_tokens - 1`` can have kept children; the others are not expanded (same
    result, less drafter work, and growth stops early when no node qualifies).
    """
    steps = grow_tree_steps(root_row, gamma, top_k, total_tokens, expand_fn)
    try:
        request = next(steps)
        while True:
            request = steps.send(step(*request))
    except StopIteration as grown:
        return grown.value


def grow_tree_steps(root_row: torch.Tensor, gamma: int, top_k: int, total_tokens: int,
                    expand_fn: ExpandFn | None = None) -> TreeSteps:
    """:func:`grow_tree` as a generator: yields each step's (nodes, tokens, parents), is sent the rows (k, V) the
    step would return, returns the tree; so a batch of requests grows its trees in lockstep, one drafter call per
    depth for all of them."""
    if gamma < 1 or top_k < 1 or total_tokens < 1:
        raise ValueError(f"gamma, top_k and total_tokens must be >= 1, got {gamma}, {top_k}, {total_tokens}")
    expand_fn = expand_fn or (lambda nodes, scores, rows: expand(nodes, scores, rows, top_k))
    root = torch.full((1,), -1, dtype=torch.long, device=root_row.device)
    zero = torch.zeros(1, dtype=torch.float32, device=root_row.device)
    expanded = [root_row[None]]
    tokens, parents, scores, ranks = expand_fn(root, zero, expanded[0])
    parts = [[tokens], [parents], [scores], [ranks], [torch.zeros_like(tokens)]]
    all_scores, last_start, fed = scores, 0, 1
    for _ in range(gamma - 1):
        chosen = _expandable(all_scores, last_start, top_k, total_tokens)
        if chosen.numel() == 0:
            break
        all_tokens, all_parents = torch.cat(parts[0]), torch.cat(parts[1])
        rows = yield chosen, all_tokens[chosen], all_parents[chosen]  # (k, V)
        expanded.append(rows)
        tokens, parents, scores, ranks = expand_fn(chosen, all_scores[chosen], rows)
        position = torch.full((all_tokens.numel(),), -1, dtype=torch.long, device=chosen.device)
        position[chosen] = torch.arange(chosen.numel(), device=chosen.device)
        slot = fed + position[parents]  # the row (of ``expanded``, stacked) each child was drawn from
        fed += chosen.numel()
        last_start = all_scores.numel()
        for part, value in zip(parts, (tokens, parents, scores, ranks, slot), strict=True):
            part.append(value)
        all_scores = torch.cat(parts[2])
    candidates = Candidates(*(torch.cat(part) for part in parts))
    return select_tree(candidates, total_tokens, expanded)


def _expandable(scores: torch.Tensor, last_start: int, top_k: int, total_tokens: int) -> torch.Tensor:
    """Candidates to feed next: the ``top_k`` best of the last depth among the best ``total_tokens - 1`` overall."""
    eligible = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    eligible[most_confident(scores, total_tokens - 1)] = True
    last = torch.arange(last_start, scores.numel(), device=scores.device)
    last = last[eligible[last_start:]]
    return last[most_confident(scores[last], top_k)]
