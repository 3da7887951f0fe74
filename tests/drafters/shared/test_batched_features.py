"""Feature drafting in batches (drafters/shared/batched_features.py): for eagle and eagle3, chains and trees, every
slot's draft is the one it drafts alone, the batch runs one draft-layer call per step for all slots, and each request
keeps its batch-1 greedy text."""

import pytest
import torch
from batched_twins import twin_check

import specfamily as sf
from specfamily.core.types import SamplingConfig
from specfamily.drafters.eagle.drafter import Eagle3Drafter, EagleDrafter, EagleFamilyDrafter

GREEDY, T1, NUCLEUS = SamplingConfig(), SamplingConfig(temperature=1.0), SamplingConfig(0.7, top_k=5, top_p=0.9)
CASES = [  # (name, options, sampling, a q is reported)
    pytest.param("eagle", {"mode": "chain", "gamma": 4}, GREEDY, False, id="eagle-chain-greedy"),
    pytest.param("eagle", {"mode": "chain", "gamma": 4}, NUCLEUS, True, id="eagle-chain-nucleus"),
    pytest.param("eagle", {"gamma": 4}, GREEDY, False, id="eagle-tree-greedy"),
    pytest.param("eagle", {"gamma": 4}, T1, False, id="eagle-topk-tree-t1"),
    pytest.param("eagle", {"gamma": 4, "tree_sampling": "sampled"}, T1, True, id="eagle-sampled-tree-t1"),
    pytest.param("eagle3", {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 12}, GREEDY, False,
                 id="eagle3-tree-greedy"),
    pytest.param("eagle3", {"weights": "random", "mode": "chain", "gamma": 3}, NUCLEUS, True,
                 id="eagle3-chain-nucleus"),
]


@pytest.mark.parametrize(("name", "options", "sampling", "sampled"), CASES)
def test_each_slot_drafts_what_it_drafts_alone(name, options, sampling, sampled, code_target, prompts, monkeypatch):
    """Every pass of a batch with admissions and ragged acceptance: tokens and parents equal, q to 4e-6 in float32
    (the rounding of a call of another shape: 2.1e-6 on the eagle chain's stream since drafters draw by inversion,
    about 18 float32 ulps of 1; float64 holds 1e-12 below), the same generator draws."""
    cls = EagleDrafter if name == "eagle" else Eagle3Drafter
    log = twin_check(monkeypatch, cls, code_target, atol=4e-6)
    drafter = sf.create_drafter(name, code_target, **options)
    sf.generate_batch(code_target, drafter, prompts, max_new_tokens=16, sampling=sampling, max_batch=3)
    assert log.calls >= 4 and log.widest == 3 and log.drafts >= 3 * 4
    assert log.sampled == (log.drafts if sampled else 0)


@pytest.mark.parametrize("options", [{"tree_sampling": "sampled"}, {"mode": "chain"}], ids=["tree", "chain"])
def test_in_float64_a_sampled_draft_is_its_batch_1_draft_to_1e_12(options, prompts, monkeypatch):
    target = sf.load_target("zoo:code-target", dtype=torch.float64)
    log = twin_check(monkeypatch, EagleDrafter, target, atol=1e-12)
    drafter = sf.create_drafter("eagle", target, gamma=4, **options)
    sf.generate_batch(target, drafter, prompts, max_new_tokens=12, sampling=T1, max_batch=3)
    assert log.sampled >= 8 and log.widest == 3


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_the_batch_drafts_in_one_layer_call_per_step(mode, code_target, prompts, monkeypatch):
    """One call for every slot's catch-up, then one per depth (gamma - 1 of them at most), each over all slots."""
    gamma = 4
    drafter = sf.create_drafter("eagle", code_target, gamma=gamma, mode=mode)
    calls, proposals = [], []
    step, propose_batch = EagleFamilyDrafter._step, EagleFamilyDrafter.propose_batch

    def spy_step(self, tokens, *args):
        calls.append(tokens.shape[0])
        return step(self, tokens, *args)

    def spy_propose(self, drafters, ctxs, gammas):
        before = len(calls)
        drafts = propose_batch(self, drafters, ctxs, gammas)
        proposals.append((len(calls) - before, sum(len(d) > 0 for d in drafts), max(gammas)))
        return drafts

    monkeypatch.setattr(EagleFamilyDrafter, "_step", spy_step)
    monkeypatch.setattr(EagleFamilyDrafter, "propose_batch", spy_propose)
    sf.generate_batch(code_target, drafter, prompts[:4], max_new_tokens=16, max_batch=4)
    drafted = [(n, slots, g) for n, slots, g in proposals if slots]
    assert drafted and max(slots for _, slots, _ in drafted) == 4
    assert all(1 <= n <= g for n, _, g in drafted)  # catch-up + at most gamma - 1 depths, however many slots
    assert max(calls) == 4  # a call spans the batch (one per slot would be 1 row of slots each)
    assert sum(n for n, _, _ in drafted) == len(calls)  # no layer call outside the batched proposals


@pytest.mark.parametrize(("name", "options"), [("eagle", {}), ("eagle3", {"weights": "random"})])
def test_each_request_keeps_its_batch_1_greedy_text(name, options, code_target, prompts):
    reference = [sf.generate(code_target, sf.create_drafter(name, code_target, **options), p, max_new_tokens=20,
                             seed=i).tokens for i, p in enumerate(prompts)]
    results = sf.generate_batch(code_target, sf.create_drafter(name, code_target, **options), prompts,
                                max_new_tokens=20, max_batch=4)
    assert [r.tokens for r in results] == reference


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_a_gpt2_eagle_drafts_in_batches_what_it_drafts_alone(mode, monkeypatch):
    """GPT-2's eagle layer runs the module path (absolute positions, the block's own attention)."""
    from specfamily.testing import tiny_target

    target = tiny_target("gpt2", vocab_size=64, spread=1.0, dtype=torch.float32)
    log = twin_check(monkeypatch, EagleDrafter, target, atol=2e-6)
    options = {"tree_sampling": "sampled"} if mode == "tree" else {}
    drafter = sf.create_drafter("eagle", target, weights="random", mode=mode, gamma=3, **options)
    prompts = [[1, 2, 3, 1, 2, 3], [5, 6], [7, 8, 9, 10], [11, 3, 4]]
    sf.generate_batch(target, drafter, prompts, max_new_tokens=15, max_batch=3, sampling=T1)
    assert log.sampled == log.drafts >= 3 * 4 and log.widest == 3
    assert drafter.model.parts.positions is not None  # GPT-2's position table: the module path


@pytest.mark.parametrize(("name", "options"), [("eagle", {}), ("eagle3", {"weights": "random"})])
def test_a_batch_that_plans_no_draft_runs_no_draft_layer(name, options, code_target, prompts, monkeypatch):
    """Idle passes (every length the batch's policy plans is 0) cost the drafter only ``observe``: the catch-up
    waits for a pass that drafts, so the layer is never called, and the text is plain batched decoding's."""
    from specfamily.core.batch_lengths import LengthPolicy

    # every way the loop asks (a recorded decision or an idle bound passes more arguments): nothing drafts
    monkeypatch.setattr(LengthPolicy, "lengths", lambda self, prospects, *args, **kwargs: [0] * len(prospects))
    calls, queued = [], []
    step, observe = EagleFamilyDrafter._step, EagleFamilyDrafter.observe

    def spy_observe(self, outcome):
        observe(self, outcome)
        queued.append(self.state.pending_rows)

    monkeypatch.setattr(EagleFamilyDrafter, "_step", lambda self, *args: calls.append(1) or step(self, *args))
    monkeypatch.setattr(EagleFamilyDrafter, "observe", spy_observe)
    plain = sf.generate_batch(code_target, None, prompts, max_new_tokens=12, max_batch=4)
    idle = sf.generate_batch(code_target, sf.create_drafter(name, code_target, **options), prompts,
                             max_new_tokens=12, max_batch=4)
    assert [r.tokens for r in idle] == [r.tokens for r in plain]
    assert calls == [] and len(queued) >= len(prompts) * 10
    assert max(queued) >= min(len(p) for p in prompts) + 10  # the prompt's and every pass's features, still queued
