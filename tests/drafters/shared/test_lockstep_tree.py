"""EAGLE-2 top-k trees in lockstep, fixed shapes (drafters/shared/lockstep_tree.py): every slot's kept tree is
grow_tree's, tokens and parents, through early stops, depths fed fewer than top_k live nodes and tied scores; a
slot stops at its own depth; a kept set that is not closed is reported."""

from collections import Counter

import pytest
import torch

import specfamily as sf
from specfamily.core.target import load_target
from specfamily.drafters.eagle import drafter as eagle_drafter
from specfamily.drafters.shared.dynamic_tree import grow_tree
from specfamily.drafters.shared.feature_drafting import FeatureDrafter
from specfamily.drafters.shared.lockstep_tree import Candidates, KeptTrees, grow_lockstep, kept_drafts, select_lockstep
from specfamily.testing import tiny_model
from specfamily.testing.syncs import SyncCounter, on_host, stand_in_module

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


def test_a_kept_set_not_closed_is_refused_when_read_as_drafts():
    kept = KeptTrees(torch.tensor([[5, 6]]), torch.tensor([[-1, 0]]), torch.tensor([2]), torch.tensor([True]))
    with pytest.raises(RuntimeError, match="^a top-k tree kept a node without its parent or an earlier sibling$"):
        kept_drafts(kept, lambda ids: ids)
    kept.open[0] = False
    draft = kept_drafts(kept, lambda ids: ids + 100)[0]
    assert draft.tokens.tolist() == [105, 106] and draft.parents.tolist() == [-1, 0] and draft.q is None


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match=r"top_k must be in 1\.\.9, depths and totals >= 1; got top_k 10"):
        grow_lockstep(torch.zeros(1, V), [2], 10, [4], lambda *a: None)


def _eagle_on(stand_ins: bool, name: str, **options):
    """(a tiny target, its random-weight ``name`` drafter), the target's weights stand-ins for an accelerator's or
    on the CPU; made inside a SyncCounter."""
    model = tiny_model("llama", 64, 0, torch.float32, spread=1.0)
    if stand_ins:
        stand_in_module(model)
    target = load_target(model)
    return target, sf.create_drafter(name, target, weights="random", **options)


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_a_batched_tree_proposal_waits_for_the_host_once_whatever_the_slots(name, monkeypatch):
    """On a stand-in model (weights "on an accelerator", specfamily.testing.syncs), every batched proposal of top-k
    trees waits once, for the kept trees of all its slots (grow_tree waited per depth and per request: eagle 53
    waits a pass at 4 requests); the decoding is the CPU's."""
    prompts = [[int(t) for t in torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n))]
               for n in (5, 7, 4, 9, 6)]

    def run(stand_ins: bool) -> tuple[list, list[tuple[int, int]]]:
        waits, propose = [], eagle_drafter.propose_feature_batch

        def counted(drafters, ctxs, gammas, rows):
            before = len(counter.syncs)
            drafts = propose(drafters, ctxs, gammas, rows)
            waits.append((sum(1 for d in drafts if len(d)), len(counter.syncs) - before))
            return drafts

        monkeypatch.setattr(eagle_drafter, "propose_feature_batch", counted)
        with SyncCounter() as counter:
            target, drafter = _eagle_on(stand_ins, name, gamma=3)
            results = sf.generate_batch(target, drafter, prompts, 8, max_batch=4, trace=False)
        monkeypatch.undo()
        return [r.tokens for r in results], waits

    tokens, waits = run(stand_ins=True)
    assert tokens == run(stand_ins=False)[0]
    assert max(slots for slots, _ in waits) >= 3  # proposals for several slots at once were counted
    assert all(n == 1 for slots, n in waits if slots), waits


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_at_batch_1_off_the_cpu_a_tree_proposal_waits_once_and_keeps_grow_trees_tree(name, monkeypatch):
    """At batch 1 on a stand-in model (an accelerator's path) a top-k tree grows in lockstep too: each proposal waits
    once, for its kept tree (grow_tree waits once a depth and more); every draft is the one the CPU grows with
    grow_tree, token for token and parent for parent."""
    prompt = [3, 17, 9, 40, 2, 33, 8]

    def run(stand_ins: bool) -> tuple[list, list[int]]:
        drafts, waits, tree = [], [], FeatureDrafter._tree

        def counted(self, ctx, root, gamma):
            before = len(counter.syncs)
            draft = tree(self, ctx, root, gamma)
            waits.append(len(counter.syncs) - before)
            drafts.append((on_host(draft.tokens).tolist(), on_host(draft.parents).tolist()))
            return draft

        monkeypatch.setattr(FeatureDrafter, "_tree", counted)
        with SyncCounter() as counter:
            target, drafter = _eagle_on(stand_ins, name, gamma=4, top_k=3, total_tokens=8)
            sf.generate(target, drafter, prompt, 16)
        monkeypatch.undo()
        return drafts, waits

    drafts, waits = run(stand_ins=True)
    assert len(drafts) >= 4 and waits == [1] * len(drafts), waits
    assert drafts == run(stand_ins=False)[0]
    assert max(len(tokens) for tokens, _ in drafts) == 8  # trees of the full budget were compared
