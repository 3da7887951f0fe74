"""self_spec in batches (drafters/self_spec/batched.py): every slot's draft is the one it drafts alone, one skip-layer
pass per draft step for all slots, on the batch's cache without copying a slot's entries, lengths left as found."""

import pytest
from batched_twins import twin_check

import specfamily as sf
from specfamily.core.types import SamplingConfig
from specfamily.drafters.self_spec.drafter import SelfSpecDrafter
from specfamily.drafters.self_spec.layers import LayerRunner
from specfamily.runtime.batch_cache import BatchCache

SKIP = ["layer:1", "mlp:2"]


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(0.7, top_k=5, top_p=0.9)],
                         ids=["greedy", "t0.7-topk-topp"])
def test_each_slot_drafts_what_it_drafts_alone(sampling, code_target, prompts, monkeypatch):
    log = twin_check(monkeypatch, SelfSpecDrafter, code_target, atol=2e-6)
    drafter = sf.create_drafter("self_spec", code_target, skip=SKIP, gamma=4)
    sf.generate_batch(code_target, drafter, prompts, max_new_tokens=16, sampling=sampling, max_batch=3)
    assert log.calls >= 4 and log.widest == 3 and log.drafts >= 3 * 4
    assert log.sampled == (0 if sampling.greedy else log.drafts)


def test_an_adaptive_exit_cuts_each_slots_draft_as_alone(code_target, prompts, monkeypatch):
    log = twin_check(monkeypatch, SelfSpecDrafter, code_target, atol=2e-6)
    drafter = sf.create_drafter("self_spec", code_target, skip=SKIP, gamma=5, adaptive_exit=True)
    sf.generate_batch(code_target, drafter, prompts, max_new_tokens=16, max_batch=4)
    assert log.drafts > 0 and log.widest == 4


def test_one_pass_per_draft_step_on_the_batch_cache_without_copying_a_slot(code_target, prompts, monkeypatch):
    drafter = sf.create_drafter("self_spec", code_target, skip=SKIP, gamma=3)
    rows, views, proposals = [], [], []
    hidden, slot_view, propose_batch = LayerRunner.hidden, BatchCache.slot_view, SelfSpecDrafter.propose_batch

    def spy_hidden(self, ids, *args):
        rows.append(ids.shape[0])
        return hidden(self, ids, *args)

    def spy_view(self, slot):
        views.append(slot)
        return slot_view(self, slot)

    def spy_propose(self, drafters, ctxs, gammas):
        cache = ctxs[0].target.batch_cache
        lengths, before = list(cache.lengths), len(rows)
        drafts = propose_batch(self, drafters, ctxs, gammas)
        assert cache.lengths == lengths  # the committed lengths as they were
        proposals.append((len(rows) - before, max(gammas), sum(len(d) > 0 for d in drafts)))
        return drafts

    monkeypatch.setattr(LayerRunner, "hidden", spy_hidden)
    monkeypatch.setattr(BatchCache, "slot_view", spy_view)
    monkeypatch.setattr(SelfSpecDrafter, "propose_batch", spy_propose)
    results = sf.generate_batch(code_target, drafter, prompts[:4], max_new_tokens=16, max_batch=4)
    assert not views  # no batch-1 view of a slot (whose appends copy the slot's entries)
    assert proposals and all(passes == gamma for passes, gamma, _ in proposals)  # one pass per draft step
    assert max(rows) == 4 == max(slots for *_, slots in proposals)  # ... over every drafting slot at once
    reference = [sf.generate(code_target, sf.create_drafter("self_spec", code_target, skip=SKIP, gamma=3), p,
                             max_new_tokens=16).tokens for p in prompts[:4]]
    assert [r.tokens for r in results] == reference


def test_a_gpt2_target_drafts_in_batches_what_it_drafts_alone(monkeypatch):
    import torch

    from specfamily.testing import tiny_target

    target = tiny_target("gpt2", vocab_size=64, spread=1.0, dtype=torch.float32)
    log = twin_check(monkeypatch, SelfSpecDrafter, target, atol=2e-6)
    drafter = sf.create_drafter("self_spec", target, skip=["mlp:1"], gamma=3)
    prompts = [[1, 2, 3, 1, 2, 3], [5, 6], [7, 8, 9, 10], [11, 3, 4]]
    sf.generate_batch(target, drafter, prompts, max_new_tokens=15, max_batch=3, sampling=SamplingConfig(1.0))
    assert log.sampled == log.drafts >= 3 * 4 and log.widest == 3
