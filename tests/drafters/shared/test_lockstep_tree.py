"""EAGLE-2 top-k trees in lockstep, fixed shapes (drafters/shared/lockstep_tree.py): every slot's kept tree is
grow_tree's, tokens and parents, through early stops, depths fed fewer than top_k live nodes and tied scores; a
slot stops at its own depth; a kept set that is not closed is reported."""

from collections import Counter

import pytest
import torch

from specfamily.drafters.shared.dynamic_tree import grow_tree
from specfamily.drafters.shared.lockstep_tree import Candidates, grow_lockstep, select_lockstep

V = 9


def _table(seed: int) -> torch.Tensor:
    """(depth, token) -> log-probabilities over V, from logits in a few integer levels: many tied scores."""
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randint(0, 3, (8, V), generator=gen).float(), dim=-1)


def _row(table: torch.Tensor, depth: int, token: int) -> torch.Tensor:
    """A fed node's children's row: the table's, rolled by the node's token (so siblings' rows differ)."""
    return table[depth].roll(token)


def _alone(table: torch.Tensor, root: int, depth: int, top_k: int, total: int, seen: Counter) -> tuple:
    """grow_tree's kept (tokens, parents) for one slot; counts its early stops and depths fed under top_k nodes."""
    calls = []

    def step(nodes, tokens, parents):
        calls.append(nodes.numel())
        return torch.stack([_row(table, len(calls), int(t)) for t in tokens])

    tree = grow_tree(_row(table, 0, root), step, depth, top_k, total)
    seen["early"] += len(calls) < depth - 1
    seen["partial"] += any(k < top_k for k in calls)
    return tree.tokens.tolist(), tree.parents.tolist()


def _compare(seed: int, seen: Counter) -> None:
    gen = torch.Generator().manual_seed(100 + seed)
    batch, top_k = 4, int(torch.randint(1, 5, (1,), generator=gen))
    depths = torch.randint(1, 6, (batch,), generator=gen).tolist()
    totals = torch.randint(1, 20, (batch,), generator=gen).tolist()
    roots = torch.randint(0, V, (batch,), generator=gen).tolist()
    table, fed = _table(seed), []

    def step(active, nodes, tokens, parents):
        fed.append(active)
        return torch.stack([torch.stack([_row(table, len(fed), int(t)) for t in tokens[b]]) for b in active])

    kept = grow_lockstep(torch.stack([_row(table, 0, r) for r in roots]), depths, top_k, totals, step)
    for b in range(batch):
        count = int(kept.counts[b])
        tokens, parents = _alone(table, roots[b], depths[b], top_k, totals[b], seen)
        assert (kept.tokens[b, :count].tolist(), kept.parents[b, :count].tolist()) == (tokens, parents), (seed, b)
        seen["nodes"] += count
    assert not kept.open.any()
    assert fed == [[b for b in range(batch) if depths[b] > d] for d in range(1, max(depths))]  # to its own depth


def test_every_slot_keeps_the_tree_grow_tree_keeps():
    """40 random batches (top_k 1-4, depths 1-5 and totals 1-19 per slot, tied scores): the comparison reaches
    grow_tree's early stops and its depths that feed fewer than top_k nodes."""
    seen = Counter()
    for seed in range(40):
        _compare(seed, seen)
    assert seen["early"] > 0 and seen["partial"] > 0 and seen["nodes"] > 400


def test_a_kept_node_without_its_parent_is_reported():
    """A child scored above its parent (never in a top-k tree) would be kept alone: reported, not closed."""
    tokens = torch.tensor([[3, 4, 5]])
    candidates = Candidates(tokens, torch.tensor([[-1, -1, 0]]), torch.tensor([[-2.0, -1.0, -0.5]]),
                            torch.ones(1, 3, dtype=torch.bool))
    kept = select_lockstep(candidates, torch.tensor([2]), 2, top_k=2)
    assert kept.open.tolist() == [True] and kept.counts.tolist() == [2]


def test_a_kept_later_sibling_without_the_earlier_one_is_reported():
    candidates = Candidates(torch.tensor([[3, 4]]), torch.tensor([[-1, -1]]), torch.tensor([[-2.0, -1.0]]),
                            torch.ones(1, 2, dtype=torch.bool))
    assert select_lockstep(candidates, torch.tensor([1]), 1, top_k=2).open.tolist() == [True]
    assert select_lockstep(candidates, torch.tensor([2]), 2, top_k=2).open.tolist() == [False]


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match=r"top_k must be in 1\.\.9, depths and totals >= 1; got top_k 10"):
        grow_lockstep(torch.zeros(1, V), [2], 10, [4], lambda *a: None)
