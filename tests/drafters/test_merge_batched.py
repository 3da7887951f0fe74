"""merge in batches (MergeDrafter.propose_batch): each part proposes for every slot in one call of its own
``propose_batch`` (eagle3's draft layer and the small model batched), every slot's merged draft is the one it drafts
alone, and each request keeps its plain greedy text."""

import pytest
from batched_twins import twin_check

import specfamily as sf
from specfamily.core.types import SamplingConfig
from specfamily.drafters.eagle.drafter import Eagle3Drafter
from specfamily.drafters.merge.drafter import MergeDrafter
from specfamily.testing import draft_model_for

EAGLE3 = {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 12}
SAMPLED = {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 20, "tree_sampling": "sampled"}


def _merge(target, parts, eagle3=EAGLE3, **options):
    chosen = {"eagle3": dict(eagle3), "suffix": {"gamma": 3}, "prompt_lookup": {"gamma": 3, "branches": 2}}
    if "small_model" in parts:
        chosen["small_model"] = {"model": draft_model_for(target), "gamma": 3}
    return sf.create_drafter("merge", target, parts=list(parts), options={p: chosen[p] for p in parts}, **options)


@pytest.mark.parametrize(("parts", "eagle3", "sampling", "sampled"), [
    pytest.param(("suffix", "eagle3"), EAGLE3, SamplingConfig(), False, id="suffix+eagle3-greedy"),
    pytest.param(("eagle3", "small_model"), SAMPLED, SamplingConfig(temperature=1.0), True,
                 id="eagle3+small_model-sampled"),
])
def test_each_slot_drafts_what_it_drafts_alone(parts, eagle3, sampling, sampled, code_target, prompts, monkeypatch):
    """Every pass of a batch with admissions and ragged acceptance: tokens and parents equal, q to 4e-6 in float32
    (the parts' own batched rounding), the same generator draws in each slot (part by part, in the parts' order)."""
    log = twin_check(monkeypatch, MergeDrafter, code_target, atol=4e-6)
    drafter = _merge(code_target, parts, eagle3, gamma=3)  # a merged gamma: every pass drafts
    sf.generate_batch(code_target, drafter, prompts, max_new_tokens=16, sampling=sampling, max_batch=3)
    assert log.calls >= 4 and log.widest == 3 and log.drafts >= 3 * 4
    assert log.sampled == (log.drafts if sampled else 0)


def test_a_model_part_drafts_every_slot_in_one_call(code_target, prompts, monkeypatch):
    """eagle3's part proposes through its batched call for all drafting slots, never slot by slot."""
    widths, alone = [], []
    batched, single = Eagle3Drafter.propose_batch, Eagle3Drafter.propose

    def spy_batched(self, drafters, ctxs, gammas):
        widths.append(sum(g > 0 for g in gammas))
        return batched(self, drafters, ctxs, gammas)

    def spy_single(self, ctx, gamma):
        alone.append(gamma)
        return single(self, ctx, gamma)

    monkeypatch.setattr(Eagle3Drafter, "propose_batch", spy_batched)
    monkeypatch.setattr(Eagle3Drafter, "propose", spy_single)
    drafter = _merge(code_target, ("suffix", "eagle3"), gamma=3)
    results = sf.generate_batch(code_target, drafter, prompts[:4], max_new_tokens=16, max_batch=4)
    assert max(widths) == 4 and len(widths) >= 5
    assert not alone  # no slot's eagle3 proposed on its own
    assert [r.tokens for r in results] == [r.tokens for r in sf.generate_batch(code_target, None, prompts[:4],
                                                                              max_new_tokens=16, max_batch=4)]
    assert any(r.metrics.mean_accepted_length > 1.0 for r in results)  # drafts were accepted, not only proposed

