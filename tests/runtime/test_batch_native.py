"""A batched pass as one call of the C++ layer loop (``batch_lean.slot_forward``, ``NativeLayers.forward_slots``).

Where the target's lean forward multiplies with the stream kernel and attends with the batch-invariant attention
kernel, every fed row of a batched pass (B = 2..8 slots, ragged caches, ragged chains, trees, slots that draft nothing)
gets exactly the logits and features (``torch.equal``) of the batch-1 pass over its own request, and greedy batched
text equals batch-1 text token for token with random trees; passes the kernel does not take (a prompt over an empty
cache, no attention kernel) keep the Python path, and so does every batched pass after a native call failed (that pass
run again, greedy text unchanged). Skipped where the native loop or the attention kernel cannot build.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specfamily as sf
from specfamily.core.batch_target import BatchTarget, SlotFeed, native_failure
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime.attention import attention_build
from specfamily.runtime.native_layers import native_build
from specfamily.testing import RandomTreeDrafter

VOCAB = 64
pytestmark = pytest.mark.skipif(
    not (native_build().available and attention_build().available),
    reason=f"no native layers or attention kernel: {native_build().reason or attention_build().reason}",
)

TREES = [
    Draft(torch.tensor([3, 4, 5, 6]), torch.tensor([-1, -1, 0, 2])),
    Draft.empty(),
    Draft.chain([11, 12]),
    Draft.chain([9]),
    Draft(torch.tensor([7, 8, 9]), torch.tensor([-1, 0, 0])),
    Draft.empty(),
    Draft.chain([1, 2, 3, 4, 5]),
    Draft.chain([13, 14, 15]),
]


def _target(native_attention: bool = True) -> Target:
    """SmolLM2's grouping (9 query heads over 3 key/value heads), heads 16 wide, 2 layers, stream products."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=144, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    target = Target(model.eval(), matmul="stream", native_attention=native_attention)
    assert target.lean.native is not None
    assert (target.lean.attention is not None) == native_attention
    return target


def _prompts(count: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, VOCAB, (2 + (5 * i) % 11,), generator=gen) for i in range(count)]


def _fill(batch: BatchTarget, slot: int, prompt: torch.Tensor) -> None:
    """Slot's cache filled token by token (one-row passes: the attention kernel's in batch 1 too)."""
    for token in prompt[:-1]:
        batch.forward(slot, [SlotFeed(token[None], Draft.empty())])
        batch.commit(slot, [])


def _batch_1(target: Target, prompt: torch.Tensor, draft: Draft, features):
    """The batch-1 pass over the same request, its cache filled the same way."""
    target.reset()
    for token in prompt[:-1]:
        target.forward(token[None])
        target.commit([])
    out = target.forward(prompt[-1:], draft, features=features)
    target.commit([])
    return out


@pytest.mark.parametrize("features", [True, (0, 1, 2)])
@pytest.mark.parametrize("slots", [2, 3, 5, 8])
def test_a_batched_pass_scores_each_row_as_its_batch_1_pass_bit_for_bit(slots, features):
    target = _target()
    prompts, trees = _prompts(slots), TREES[:slots]
    batch = BatchTarget(target, slots=slots, capacity=4)  # small: the buffers grow between native passes
    for slot, prompt in enumerate(prompts):
        _fill(batch, slot, prompt)
    calls = target.lean.native.calls
    outs = batch.forward(0, [SlotFeed(p[-1:], d) for p, d in zip(prompts, trees, strict=True)], features=features)
    assert target.lean.native.calls == calls + 1  # the whole batched pass: one native call
    assert batch.rows == sum(1 + len(d) for d in trees)
    for out, prompt, tree in zip(outs, prompts, trees, strict=True):
        ref = _batch_1(target, prompt, tree, features)
        assert out.logits.shape == (len(tree) + 1, VOCAB)
        assert torch.equal(out.logits, ref.logits)
        assert torch.equal(out.features, ref.features)


def test_kept_entries_after_commit_score_the_next_pass_as_batch_1():
    """Slot 0 keeps nodes [0, 2, 3] of its tree (entries moved), slot 1 its whole chain, slot 2 nothing; the next pass
    (several pending tokens per slot: the roots after acceptance) still matches batch 1 bit for bit."""
    target = _target()
    prompts = _prompts(3)
    trees = [TREES[0], Draft.chain([11, 12]), TREES[1]]
    kept = [[0, 2, 3], [0, 1], []]
    batch = BatchTarget(target, slots=3, capacity=8)
    for slot, prompt in enumerate(prompts):
        _fill(batch, slot, prompt)
    batch.forward(0, [SlotFeed(p[-1:], d) for p, d in zip(prompts, trees, strict=True)])
    for slot, nodes in enumerate(kept):
        batch.commit(slot, nodes)
    pending = [torch.tensor([20, 21]), torch.tensor([22]), torch.tensor([23, 24, 25])]
    second = [Draft.chain([30, 31]), Draft.empty(), Draft(torch.tensor([5, 6]), torch.tensor([-1, -1]))]
    outs = batch.forward(0, [SlotFeed(p, d) for p, d in zip(pending, second, strict=True)], features=True)
    for slot, out in enumerate(outs):
        target.reset()
        for token in prompts[slot][:-1]:
            target.forward(token[None])
            target.commit([])
        target.forward(prompts[slot][-1:], trees[slot])
        target.commit(kept[slot])
        ref = target.forward(pending[slot], second[slot], features=True)
        target.commit([])
        assert torch.equal(out.logits, ref.logits) and torch.equal(out.features, ref.features)


def test_a_prompt_over_an_empty_cache_keeps_the_python_path():
    """Batch 1 prefills with sdpa's causal pass, not the kernel: so does the batched prefill (no native call)."""
    target = _target()
    batch = BatchTarget(target, slots=2, capacity=16)
    calls = target.lean.native.calls
    batch.forward(0, [SlotFeed(p, Draft.empty()) for p in _prompts(2)])
    assert target.lean.native.calls == calls


def test_without_the_attention_kernel_batched_passes_keep_the_python_path():
    target = _target(native_attention=False)
    prompts = _prompts(3)
    batch = BatchTarget(target, slots=3, capacity=16)
    for slot, prompt in enumerate(prompts):
        _fill(batch, slot, prompt)
    calls = target.lean.native.calls
    outs = batch.forward(0, [SlotFeed(p[-1:], d) for p, d in zip(prompts, TREES, strict=False)])
    assert target.lean.native.calls == calls
    for out, prompt, tree in zip(outs, prompts, TREES, strict=False):
        torch.testing.assert_close(out.logits, _batch_1(target, prompt, tree, False).logits, rtol=1e-5, atol=1e-5)


def _random_trees_case(count: int):
    """(target, a random-tree drafter, ``count`` random prompts of 2-14 tokens, each prompt's batch-1 greedy text)."""
    target = _target()
    drafter = RandomTreeDrafter(target, gamma=3, nodes=6)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (2 + 3 * (i % 5),), generator=gen).tolist() for i in range(count)]
    reference = [sf.generate(target, drafter, p, max_new_tokens=16, seed=i).tokens for i, p in enumerate(prompts)]
    return target, drafter, prompts, reference


@pytest.mark.parametrize("max_batch", [3, None])
def test_greedy_batched_text_with_random_trees_equals_batch_1(max_batch):
    target, drafter, prompts, reference = _random_trees_case(6)
    calls = target.lean.native.calls
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=16, max_batch=max_batch)
    assert [r.tokens for r in results] == reference
    assert target.lean.native.calls > calls  # batched passes ran natively


def _failing(native, calls: list[int]):
    """``native.forward_slots`` that runs, then leaves NaN in every entry it wrote (each slot's fed entries, past its
    kept length) and raises: a native call that fails half-way through its cache writes."""
    real = native.forward_slots

    def forward_slots(hidden, cos, sin, buffers, slots, lengths, counts, *rest):
        real(hidden, cos, sin, buffers, slots, lengths, counts, *rest)
        calls.append(len(slots))
        for buffer in (*buffers[0], *buffers[1]):
            for slot, length, count in zip(slots, lengths, counts, strict=True):
                buffer[slot, :, length : length + count] = float("nan")
        raise RuntimeError("forward_slots: out of luck\nsecond line")

    return forward_slots


def test_a_failing_native_call_reruns_its_pass_on_the_python_path_and_warns_once(monkeypatch, caplog):
    target = _target()
    prompts, trees = _prompts(4), TREES[:4]
    batch = BatchTarget(target, slots=4, capacity=8)
    for slot, prompt in enumerate(prompts):
        _fill(batch, slot, prompt)
    kept = [layer.key_buffer.clone() for layer in batch.cache.layers]
    calls: list[int] = []
    monkeypatch.setattr(target.lean.native, "forward_slots", _failing(target.lean.native, calls))
    with caplog.at_level(logging.WARNING, logger="specfamily.core.batch_target"):
        outs = batch.forward(0, [SlotFeed(p[-1:], d) for p, d in zip(prompts, trees, strict=True)])
        for slot, tree in enumerate(trees):
            batch.commit(slot, list(range(min(len(tree), 1))))
        batch.forward(0, [SlotFeed(torch.tensor([5]), Draft.chain([6])) for _ in prompts])
    assert calls == [4]  # the one-call path was tried once, never after it failed
    assert native_failure(target) == "RuntimeError: forward_slots: out of luck"
    assert [r.getMessage() for r in caplog.records] == [
        "the batched native layer loop failed, running the batched Python passes: "
        "RuntimeError: forward_slots: out of luck"]
    for layer, before in zip(batch.cache.layers, kept, strict=True):
        for slot, p in enumerate(prompts):  # the committed entries are as they were
            assert torch.equal(layer.key_buffer[slot, :, : len(p) - 1], before[slot, :, : len(p) - 1])
    for out, prompt, tree in zip(outs, prompts, trees, strict=True):  # the failed pass, run again, is batch 1's
        assert not out.logits.isnan().any()
        torch.testing.assert_close(out.logits, _batch_1(target, prompt, tree, False).logits, rtol=1e-5, atol=1e-5)


def test_greedy_batched_text_after_a_failing_native_call_equals_batch_1(monkeypatch):
    target, drafter, prompts, reference = _random_trees_case(5)
    calls: list[int] = []
    monkeypatch.setattr(target.lean.native, "forward_slots", _failing(target.lean.native, calls))
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=16, max_batch=3)
    assert [r.tokens for r in results] == reference
    assert len(calls) == 1
    again = sf.generate_batch(target, drafter, prompts, max_new_tokens=16, max_batch=3)  # the target remembers
    assert [r.tokens for r in again] == reference and len(calls) == 1
