"""small_model in batches (drafters/small_model/batched.py): every slot's draft is the one it drafts alone, the batch
drafts in one draft-model forward per draft step, and each request keeps its batch-1 greedy text."""

import pytest
import torch
from batched_twins import twin_check

import specfamily as sf
from specfamily.core.batch_target import BatchTarget
from specfamily.core.target import Target
from specfamily.core.types import SamplingConfig
from specfamily.drafters.small_model.drafter import SmallModelDrafter

SETTINGS = [SamplingConfig(), SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9, top_k=5)]


@pytest.mark.parametrize("sampling", SETTINGS, ids=["greedy", "t1", "t0.7-topp-topk"])
def test_each_slot_drafts_what_it_drafts_alone(code_target, prompts, sampling, monkeypatch):
    """Every pass of a batch with admissions and ragged acceptance: tokens equal, q to 2e-6 in float32 (the rounding
    of a pass of another shape: about 10 ulps of a probability near 1), the same draws."""
    log = twin_check(monkeypatch, SmallModelDrafter, code_target, atol=2e-6)
    drafter = sf.create_drafter("small_model", code_target, gamma=4)
    sf.generate_batch(code_target, drafter, prompts, max_new_tokens=20, sampling=sampling, max_batch=3)
    assert log.calls >= 5 and log.widest == 3
    assert log.sampled == (0 if sampling.greedy else log.drafts) and log.drafts >= 3 * 5


def test_in_float64_q_is_the_batch_1_q_to_1e_12(prompts, monkeypatch):
    """The float32 differences are rounding: in float64 the batched q equals the batch-1 q to 1e-12."""
    target = sf.load_target("zoo:code-target", dtype=torch.float64)
    log = twin_check(monkeypatch, SmallModelDrafter, target, atol=1e-12)
    drafter = sf.create_drafter("small_model", target, gamma=4)
    sf.generate_batch(target, drafter, prompts, max_new_tokens=12, sampling=SETTINGS[2], max_batch=3)
    assert log.sampled >= 10 and log.widest == 3


def test_a_draft_that_stops_early_on_low_confidence_is_still_the_one_it_drafts_alone(code_target, prompts,
                                                                                     monkeypatch):
    log = twin_check(monkeypatch, SmallModelDrafter, code_target, atol=2e-6)
    drafter = sf.create_drafter("small_model", code_target, gamma=5, confidence=0.6)
    results = sf.generate_batch(code_target, drafter, prompts, max_new_tokens=20,
                                sampling=SamplingConfig(temperature=1.0), max_batch=4)
    assert log.drafts > 0 and log.widest == 4
    assert min(r.metrics.draft_steps / max(r.metrics.target_passes - 1, 1) for r in results) < 5  # some stopped


def test_the_batch_drafts_in_one_draft_model_forward_per_step(code_target, prompts, monkeypatch):
    drafter = sf.create_drafter("small_model", code_target, gamma=3)
    draft_model = drafter.draft
    widths, alone, expected = [], [], []
    batch_forward, target_forward, propose_batch = BatchTarget.forward, Target.forward, SmallModelDrafter.propose_batch

    def spy_batch(self, lo, feeds, *args, **kwargs):
        if self.target.model is draft_model:
            widths.append(len(feeds))
        return batch_forward(self, lo, feeds, *args, **kwargs)

    def spy_target(self, *args, **kwargs):
        if self.model is draft_model:
            alone.append(1)
        return target_forward(self, *args, **kwargs)

    def spy_propose(self, drafters, ctxs, gammas):
        backlog = any(g and len(c.tokens) - d.runner.cached_length > 2
                      for d, c, g in zip(drafters, ctxs, gammas, strict=True))
        expected.append((max(gammas) + backlog, sum(g > 0 for g in gammas)))
        return propose_batch(self, drafters, ctxs, gammas)

    monkeypatch.setattr(BatchTarget, "forward", spy_batch)
    monkeypatch.setattr(Target, "forward", spy_target)
    monkeypatch.setattr(SmallModelDrafter, "propose_batch", spy_propose)
    sf.generate_batch(code_target, drafter, prompts[:4], max_new_tokens=16, max_batch=4)
    assert not alone  # no slot ran the draft model on its own
    assert len(widths) == sum(steps for steps, _ in expected)  # one forward per draft step (+ one catch-up)
    assert max(widths) == 4 == max(slots for _, slots in expected)  # ... for every drafting slot at once
    assert len(widths) < sum(steps * slots for steps, slots in expected)  # what one forward per slot would take


def test_each_request_keeps_its_batch_1_greedy_text(code_target, prompts):
    reference = [sf.generate(code_target, sf.create_drafter("small_model", code_target), p, max_new_tokens=24).tokens
                 for p in prompts]
    drafter = sf.create_drafter("small_model", code_target)
    results = sf.generate_batch(code_target, drafter, prompts, max_new_tokens=24, max_batch=4)
    assert [r.tokens for r in results] == reference
    # at its default (draft length by load) a request in the batch's last wave drafts only while its slot is projected
    # to end last (core/batch_goodput.py); a constant length drafts for every request
    drafter = sf.create_drafter("small_model", code_target, gamma=3)
    results = sf.generate_batch(code_target, drafter, prompts, max_new_tokens=24, max_batch=4)
    assert [r.tokens for r in results] == reference
    assert all(r.metrics.draft_steps > 0 for r in results)


def test_a_draft_model_on_the_native_layer_loop_batches_and_keeps_its_text(prompts):
    """A stream target makes its draft model's lean forward run the native layer loop; batch slots copy the drafter
    (and its draft target) and each request keeps its batch-1 greedy text."""
    from specfamily.runtime.native_layers import native_build

    if not native_build().available:
        pytest.skip(f"native layer loop unavailable: {native_build().reason}")
    target = sf.load_target("zoo:code-target", matmul="stream")
    drafter = sf.create_drafter("small_model", target, gamma=3)
    assert drafter.runner.lean is not None and drafter.runner.lean.native is not None
    reference = [sf.generate(target, sf.create_drafter("small_model", target, gamma=3), p, max_new_tokens=16).tokens
                 for p in prompts]
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=16, max_batch=3)
    assert [r.tokens for r in results] == reference
    assert all(r.metrics.draft_steps > 0 for r in results)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tiny_models_of_both_families_draft_in_batches_what_they_draft_alone(family, monkeypatch):
    """GPT-2 drafts through the model's own forward (no lean forward), Llama through the lean one."""
    from specfamily.testing import draft_model_for, tiny_target

    target = tiny_target(family, vocab_size=64, spread=1.0, dtype=torch.float32)
    log = twin_check(monkeypatch, SmallModelDrafter, target, atol=2e-6)
    drafter = sf.create_drafter("small_model", target, model=draft_model_for(target), gamma=3)
    prompts = [[1, 2, 3, 1, 2, 3], [5, 6], [7, 8, 9, 10], [11, 3, 4]]
    sf.generate_batch(target, drafter, prompts, max_new_tokens=15, max_batch=3, sampling=SETTINGS[1])
    assert log.sampled >= 3 * 4 and log.widest == 3
    assert (drafter.runner.lean is None) == (family == "gpt2")


def test_a_catch_up_is_shared_among_the_slots_that_caught_up(code_target, prompts, monkeypatch):
    """Slot 0 alone asked for tokens, with its prompt as backlog: the catch-up pass's seconds (one tick of a fake
    clock) are its own, not split with a slot that proposed nothing; the loop subtracts their sum from the draft
    step it measures."""
    from specfamily.drafters.small_model import batched

    ticks = iter(range(10**6))
    monkeypatch.setattr(batched, "device_clock", lambda device: lambda: float(next(ticks)))
    drafter = sf.create_drafter("small_model", code_target, gamma=3)
    seen = []
    proposing = SmallModelDrafter.propose_batch

    def first_slot_only(self, drafters, ctxs, gammas):
        gammas = [g if i == 0 else 0 for i, g in enumerate(gammas)]
        drafts = proposing(self, drafters, ctxs, gammas)
        seen.append((len(drafters), [d.catch_up_seconds for d in drafts]))
        return drafts

    monkeypatch.setattr(SmallModelDrafter, "propose_batch", first_slot_only)
    sf.generate_batch(code_target, drafter, prompts[:2], max_new_tokens=6, max_batch=2)
    shares = next(s for n, s in seen if n == 2 and any(s))
    assert shares == [1.0, 0.0]
