"""Greedy in bf16: every registered drafter leaves transformers' greedy text only at near-ties (measured)."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.drafter import BaseDrafter
from specfamily.core.types import Draft
from specfamily.testing import draft_model_for
from specfamily.testing.greedy import (
    TIE_ULPS,
    GreedyReport,
    _first_flip,
    assert_greedy_equivalent,
    check_report,
    compare_greedy,
    greedy_case,
    ulp,
)
from specfamily.testing.tiny import single_thread

# A tiny bf16 Llama large enough for pass shapes to round differently (on the 2-layer, 32-wide models of the
# lossless suite bf16 passes happen to agree bit for bit with plain decoding: no flips at all in 50 prompts).
BF16 = {"family": "llama", "dtype": torch.bfloat16, "vocab_size": 256, "prompts": 50, "max_new_tokens": 24,
        "hidden": 64, "layers": 4}

DRAFTERS = {
    "plain": lambda t: None,
    "small_model": lambda t: sf.create_drafter("small_model", t, model=draft_model_for(t), gamma=4),
    "prompt_lookup": lambda t: sf.create_drafter("prompt_lookup", t, gamma=4, branches=2),
    "self_spec": lambda t: sf.create_drafter("self_spec", t, skip=["mlp:1"], gamma=4),
    "medusa": lambda t: sf.create_drafter("medusa", t, weights="random", gamma=3),
    "eagle": lambda t: sf.create_drafter("eagle", t, weights="random", gamma=3),
    "suffix": lambda t: sf.create_drafter("suffix", t, gamma=4, max_spec_offset=2),
}


@pytest.fixture(scope="module")
def bf16_case():
    with single_thread():
        return greedy_case(**BF16)


def test_every_registered_drafter_is_measured():
    assert set(sf.list_drafters()) <= set(DRAFTERS)


@pytest.mark.parametrize("name", DRAFTERS)
def test_bf16_greedy_flips_only_at_near_ties(bf16_case, name):
    with single_thread():
        report = compare_greedy(bf16_case, DRAFTERS[name](bf16_case.target))
    print(f"\n{name}: {report.describe()}")
    assert report.prompts == 50 and report.tokens > 1000
    check_report(report)  # every flip within TIE_ULPS ulps of bf16 in the reference's own logits


class AcceptEverything(BaseDrafter):
    """A lossy drafter whose own acceptance rule takes every draft token: greedy text it changes, at real gaps."""

    lossy = True
    default_gamma = 3

    def propose(self, ctx, gamma):
        return Draft.chain([(ctx.tokens[-1] * 7 + 3) % ctx.target.vocab_size] * gamma)

    def accept(self, draft, logits, sampling, generator):
        return list(range(len(draft))), int(logits[-1].argmax())


def test_the_near_tie_criterion_rejects_real_differences(bf16_case):
    with single_thread():
        report = compare_greedy(bf16_case, AcceptEverything(gamma=3))
    assert len(report.not_near_ties) > 40
    with pytest.raises(AssertionError, match="not a near-tie"):
        check_report(report)


def test_exact_dtypes_allow_no_flip_at_all():
    flip = _first_flip(0, [1, 2], [1, 3], torch.tensor([[0.0, 1, 0, 0], [0, 0, 0.5, 0.5]]), torch.float32)
    assert (flip.position, flip.ours, flip.reference, flip.gap) == (1, 2, 3, 0.0) and flip.near_tie
    report = GreedyReport("llama", torch.float32, 1, 2, [flip])
    with pytest.raises(AssertionError, match="greedy tokens differ at position 1"):
        check_report(report)
    check_report(GreedyReport("llama", torch.bfloat16, 1, 2, [flip]))  # the same tie is allowed in bf16


def test_flip_gap_and_tolerance():
    logits = torch.tensor([[0.5, 0.5 - 2**-8, 0.2]])  # one bf16 ulp at 0.5 is 2^-8
    flip = _first_flip(3, [1], [0], logits, torch.bfloat16)
    assert flip.gap == 2**-8 and flip.tolerance == TIE_ULPS * 2**-8 and flip.near_tie
    far = _first_flip(3, [2], [0], logits, torch.bfloat16)
    assert not far.near_tie
    assert ulp(0.3, torch.bfloat16) == 2**-9 and ulp(-1.0, torch.bfloat16) == 2**-7
    assert ulp(1.0, torch.float32) == 2**-23


def test_assert_greedy_equivalent_in_bf16_returns_the_measurement():
    [report] = assert_greedy_equivalent(DRAFTERS["self_spec"], families=("llama",), prompts=6,
                                        dtype=torch.bfloat16)
    assert report.dtype == torch.bfloat16 and report.prompts == 6 and 0 <= report.prompt_flip_rate <= 1
