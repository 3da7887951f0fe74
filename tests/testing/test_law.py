"""The conformance law's own warp (the sampling specification re-derived without the decode loop's code) and its
processors (transformers' own, over each row's whole context), on which the kit tests a penalised target."""

from __future__ import annotations

import pytest
import torch

from specfamily.core import acceptance, processors
from specfamily.core.sampling import warp
from specfamily.core.types import SamplingConfig
from specfamily.testing.conformance import PROMPT, ConformanceError, assert_lossless, exact_distribution
from specfamily.testing.law import reference_probs, reference_process, reference_warp
from specfamily.testing.mutants import warp_gallery
from specfamily.testing.rogues import HonestChain
from specfamily.testing.tiny import single_thread, tiny_target

CONFIGS = [
    SamplingConfig(0.0), SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=5),
    SamplingConfig(1.3, top_k=3, top_p=0.6), SamplingConfig(0.5, top_k=1),
]


def test_greedy_is_one_hot_at_the_first_largest_logit():
    assert reference_probs([0.5, 2.0, 2.0, -1.0], SamplingConfig(0.0)) == [0, 1, 0, 0]


def test_top_k_keeps_every_tie_at_the_kth_value():
    probs = reference_probs([3.0, 1.0, 1.0, 1.0, 0.0], SamplingConfig(1.0, top_k=2))
    assert [p > 0 for p in probs] == [True, True, True, True, False]
    assert probs[1] == probs[2] == probs[3]


def test_top_p_keeps_the_crossing_token_and_stops_when_the_mass_is_reached():
    logits = torch.tensor([0.5, 0.25, 0.125, 0.125]).log().tolist()  # softmax: 0.5, 0.25, 0.125, 0.125
    crossing = reference_probs(logits, SamplingConfig(1.0, top_p=0.6))
    assert crossing == pytest.approx([2 / 3, 1 / 3, 0, 0])
    reached = reference_probs(logits, SamplingConfig(1.0, top_p=0.5))  # 0.5 reaches 0.5: nothing more
    assert reached == pytest.approx([1, 0, 0, 0])


def test_temperature_applies_before_top_k_and_top_p():
    logits = [2.0, 1.0, 0.0, -1.0]
    # at temperature 1 the top-p 0.7 cut keeps two tokens (0.64 + 0.24 crosses it); at 0.5 the first alone has 0.86
    assert sum(p > 0 for p in reference_probs(logits, SamplingConfig(1.0, top_p=0.7))) == 2
    assert sum(p > 0 for p in reference_probs(logits, SamplingConfig(0.5, top_p=0.7))) == 1


@pytest.mark.parametrize("sampling", CONFIGS, ids=str)
def test_the_reference_agrees_with_the_loop_warp_on_random_logits(sampling):
    logits = 3 * torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    ref, loop = reference_warp(logits, sampling), warp(logits, sampling).double()
    assert torch.equal(ref > 0, loop > 0)
    assert torch.allclose(ref, loop, atol=1e-6)


def test_the_exact_law_does_not_move_with_the_loop_warp():
    """exact_distribution shares no code with the warp the loop and the drafters use: a wrong one installed in every
    module that imported it leaves the law as it was."""
    target, sampling = tiny_target("llama"), SamplingConfig(0.5, top_p=0.8)
    law = exact_distribution(target, PROMPT, 2, sampling)
    with warp_gallery()[0].installed() as hits:
        assert torch.equal(exact_distribution(target, PROMPT, 2, sampling), law)
        assert not torch.equal(acceptance.warp(torch.tensor([2.0, 1.0, 0.0, -1.0]), sampling),
                               reference_warp(torch.tensor([2.0, 1.0, 0.0, -1.0]), sampling).float())
    assert hits.count == 1 and law.sum().item() == pytest.approx(1.0)


PENALISED = {"repetition_penalty": 10.0}  # far from the plain law on the kit's prompt, so a loop without it fails
KIT = {"configs": [SamplingConfig(1.0)], "generation": PENALISED, "n_tokens": 4, "samples": 300, "min_depth": 0}


def test_the_exact_law_is_the_processed_one():
    sampling = SamplingConfig(1.0)
    with single_thread():
        penalised = exact_distribution(tiny_target("llama", generation=PENALISED), PROMPT, 2, sampling)
        plain = exact_distribution(tiny_target("llama"), PROMPT, 2, sampling)
    assert 0.5 * (penalised - plain).abs().sum().item() > 0.2
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    processed = reference_process(torch.tensor([[0, 1, 1]]), logits, tiny_target("llama", generation=PENALISED)
                                  .model.generation_config, 3)
    assert processed.tolist() == [[0.2, -10.0, 0.5, 3.0]]  # tokens 0 and 1 seen: positive / 10, negative * 10


def test_tiny_target_refuses_an_unknown_generation_setting():
    with pytest.raises(ValueError, match="generation config has no setting 'repetition_penalt'"):
        tiny_target("llama", generation={"repetition_penalt": 1.2})


def test_an_honest_drafter_passes_on_a_penalised_target():
    fit, = assert_lossless(lambda target: HonestChain(target), **KIT)
    assert fit.depth.share_verified(3) > 0.3  # the penalty was verified on rows 3 deep, with their own paths


def test_the_kit_fails_a_loop_that_does_not_apply_the_processors(monkeypatch):
    monkeypatch.setattr(acceptance, "with_processors", lambda rule, ctx: rule)
    with pytest.raises(ConformanceError, match="not lossless"):
        assert_lossless(lambda target: HonestChain(target), **KIT)


def test_the_kit_fails_rows_processed_with_the_committed_context_alone(monkeypatch):
    """Every row penalised for the committed tokens only, not for the draft tokens on its path."""
    monkeypatch.setattr(processors, "draft_paths", lambda parents: [[] for _ in range(len(parents) + 1)])
    with pytest.raises(ConformanceError, match="not lossless"):
        assert_lossless(lambda target: HonestChain(target), **KIT)
