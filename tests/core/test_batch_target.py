"""One forward over ragged slots scores each request as the batch-1 target does; per-slot commit and its guards."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specfamily as sf
from specfamily.core.batch_target import BatchTarget, SlotFeed, _roots_alone
from specfamily.core.target import load_target
from specfamily.core.types import Draft
from specfamily.testing import tiny_model, tiny_target
from specfamily.testing.syncs import SyncCounter, stand_in_module


def _batch_1(target, prompt, draft, features=False):
    target.reset()
    out = target.forward(torch.tensor(prompt), draft, features=features)
    return out


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2"])
def test_ragged_prefill_then_ragged_trees_score_as_batch_1(family):
    target = tiny_target(family, vocab_size=32, spread=1.0)  # float64
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    trees = [Draft(torch.tensor([3, 4, 5, 6]), torch.tensor([-1, -1, 0, 2])), Draft.empty(), Draft.chain([11, 12])]
    batch = BatchTarget(target, slots=3, capacity=4)  # too small: the buffers must grow and keep what they hold
    outs = batch.forward(0, [SlotFeed(torch.tensor(p), Draft.empty()) for p in prompts], features=True)
    for out, prompt in zip(outs, prompts, strict=True):
        ref = _batch_1(target, prompt, None, features=True)
        torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(out.features, ref.features, rtol=0, atol=1e-12)
    for slot in range(3):
        batch.commit(slot, [])
    assert batch.lengths == [5, 2, 3]
    roots = [torch.tensor([p[-1]]) for p in prompts]
    outs = batch.forward(0, [SlotFeed(r, t) for r, t in zip(roots, trees, strict=True)])
    for out, prompt, tree in zip(outs, prompts, trees, strict=True):
        target.reset()
        target.forward(torch.tensor(prompt))
        target.commit([])
        ref = target.forward(torch.tensor(prompt[-1:]), tree)
        assert out.logits.shape == (len(tree) + 1, 32)
        torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-12)
        target.commit([])


def test_commit_keeps_the_accepted_path_of_each_slot_on_its_own():
    """After slot 0 keeps nodes [1, 3] of its tree and slot 1 its whole chain, the next pass scores both as a
    batch-1 target that was fed the committed tokens."""
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    batch = BatchTarget(target, slots=2)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    batch.forward(0, [SlotFeed(torch.tensor(p), Draft.empty()) for p in prompts])
    batch.commit(0, [])
    batch.commit(1, [])
    tree = Draft(torch.tensor([9, 10, 11, 12]), torch.tensor([-1, -1, 0, 1]))
    chain = Draft.chain([13, 14])
    batch.forward(0, [SlotFeed(torch.tensor([20]), tree), SlotFeed(torch.tensor([21]), chain)])
    batch.commit(0, [1, 3])
    batch.commit(1, [0, 1])
    assert batch.lengths == [6, 7]  # the fed tokens and the accepted nodes (the next root is not cached yet)
    outs = batch.forward(0, [SlotFeed(torch.tensor([30]), Draft.empty()), SlotFeed(torch.tensor([31]), Draft.empty())])
    for out, context in zip(outs, [[1, 2, 3, 20, 10, 12, 30], [4, 5, 6, 7, 21, 13, 14, 31]], strict=True):
        ref = _batch_1(target, context, None)
        torch.testing.assert_close(out.logits, ref.logits, rtol=0, atol=1e-12)


def test_a_pass_over_the_tail_slots_leaves_the_others_alone():
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    batch = BatchTarget(target, slots=3)
    batch.forward(0, [SlotFeed(torch.tensor([1, 2]), Draft.empty())] * 2)
    batch.commit(0, [])
    batch.commit(1, [])
    batch.forward(2, [SlotFeed(torch.tensor([5, 6, 7]), Draft.empty())])  # a newcomer's prefill, slot 2 only
    batch.commit(2, [])
    assert batch.lengths == [2, 2, 3]


def test_guards_name_the_problem():
    target = sf.load_target(tiny_target("llama", vocab_size=32).model)
    batch = BatchTarget(target, slots=2)
    with pytest.raises(RuntimeError, match="slot 0 has no forward to commit"):
        batch.commit(0, [])
    batch.forward(0, [SlotFeed(torch.tensor([1]), Draft.chain([2, 3]))])
    with pytest.raises(RuntimeError, match="commit\\(\\) every slot of the previous pass before the next one"):
        batch.forward(0, [SlotFeed(torch.tensor([1]), Draft.empty())])
    with pytest.raises(ValueError, match=r"accepted nodes \[1\] are not a path from the root of the draft \[-1, 0\]"):
        batch.commit(0, [1])
    with pytest.raises(ValueError, match=r"draft token id 40 is outside the target's vocabulary \[0, 32\)"):
        BatchTarget(target, slots=1).forward(0, [SlotFeed(torch.tensor([1]), Draft.chain([40]))])


class _Ops(TorchDispatchMode):
    """The aten ops that compute (views left out): on an accelerator, one kernel launch each, about."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def test_a_pass_of_roots_alone_builds_its_inputs_as_the_slot_by_slot_writes_do():
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    batch = BatchTarget(target, slots=3, capacity=16)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    batch.forward(0, [SlotFeed(torch.tensor(p), Draft.empty()) for p in prompts])
    batch.commit_all({slot: [] for slot in range(3)})
    roots = [torch.tensor([p[-1]]) for p in prompts]
    plan = batch.cache.plan_pass(0, 3, 1, target.device)
    ids, positions, mask = _roots_alone(roots, plan.index, plan.extent, target.dtype)
    padded = (torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long),
              torch.full((3, 1, 1, plan.extent), torch.finfo(target.dtype).min, dtype=target.dtype))
    for b, root in enumerate(roots):
        batch._place(b, root, root[:0], (), batch.lengths[b], 1, 1, padded)
    assert all(torch.equal(a, b) for a, b in zip((ids, positions, mask), padded, strict=True))
    batch.cache.end_pass()


def test_a_pass_of_roots_alone_runs_as_many_tensor_ops_at_any_batch_size():
    """On stand-ins (what an accelerator would launch): a pass where every slot feeds its root alone, its inputs
    built and the model run, computes as many aten ops at 6 slots as at 2 (slot by slot its inputs took ~8 a slot)."""
    ops = {}
    for slots in (2, 6):
        model = tiny_model("llama", 32, 0, torch.float32, spread=1.0)
        with SyncCounter():
            stand_in_module(model)
            batch = BatchTarget(load_target(model), slots=slots, capacity=16)
            batch.forward(0, [SlotFeed(torch.tensor([1, 2, 3 + b]), Draft.empty()) for b in range(slots)])
            batch.commit_all({slot: [] for slot in range(slots)})
            feeds = [SlotFeed(torch.tensor([4]), Draft.empty()) for _ in range(slots)]
            with _Ops() as counted:
                outs = batch.forward(0, feeds)
            ops[slots] = counted.count
            assert len(outs) == slots
    assert ops[2] == ops[6], ops
