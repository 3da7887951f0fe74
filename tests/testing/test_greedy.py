"""Greedy in bf16: every registered drafter leaves transformers' greedy text only at near-ties (measured)."""

from __future__ import annotations

import pytest
import torch

from specfamily.core.drafter import BaseDrafter
from specfamily.core.types import Draft
from specfamily.recipes.every_drafter import covered, every_drafter
from specfamily.testing.greedy import (
    GAMMA,
    TIE_ULPS,
    GreedyReport,
    _first_flip,
    assert_greedy_equivalent,
    check_report,
    compare_greedy,
    greedy_case,
    greedy_prompts,
    ulp,
)
from specfamily.testing.tiny import single_thread

# A tiny bf16 Llama large enough for pass shapes to round differently (on the 2-layer, 32-wide models of the
# lossless suite bf16 passes happen to agree bit for bit with plain decoding: no flips at all in 50 prompts).
BF16 = {"family": "llama", "dtype": torch.bfloat16, "vocab_size": 256, "prompts": 50, "max_new_tokens": 24,
        "hidden": 64, "layers": 4}

DRAFTERS = every_drafter([p.tolist() for p in greedy_prompts(BF16["vocab_size"], BF16["prompts"])])


@pytest.fixture(scope="module")
def bf16_case():
    with single_thread():
        return greedy_case(**BF16)


def test_every_registered_drafter_is_measured():
    assert not covered(DRAFTERS)


@pytest.mark.parametrize("name", DRAFTERS)
def test_bf16_greedy_flips_only_at_near_ties(bf16_case, name):
    with single_thread():
        report = compare_greedy(bf16_case, DRAFTERS[name](bf16_case.target))
    print(f"\n{name}: {report.describe()}")
    assert report.prompts == 50 and report.tokens > 1000
    assert (report.drafted_passes > 0) == (name != "plain")
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
    assert report.dtype == torch.bfloat16 and report.prompts == 6
    assert report.tokens == 6 * 24 - sum(24 - flip.position - 1 for flip in report.flips)
    assert report.drafter == "SelfSpecDrafter" and report.drafted_passes > 0


class NeverDrafts(BaseDrafter):
    """Proposes nothing (as the cost-aware policy may on random heads): greedy text equal to plain, proving nothing."""

    def propose(self, ctx, gamma):
        return Draft.empty()


def test_a_drafter_that_never_drafts_fails_naming_the_drafter():
    with pytest.raises(AssertionError, match=r"NeverDrafts drafted nothing on the llama target \(0 drafted passes, "
                                             r"0 draft tokens over 2 prompts at a constant gamma 3\)"):
        assert_greedy_equivalent(lambda t: NeverDrafts(gamma=3), families=("llama",), prompts=2)


class Idle:
    """A draft-length policy that always decides drafting does not pay (as "auto" may on random heads)."""

    def reset(self):
        pass

    def next_gamma(self):
        return 0

    def update(self, *args, **kwargs):
        pass


def test_the_drafters_policy_is_overridden_unless_gamma_is_none():
    def factory(t):
        drafter = Chain(gamma=4)
        drafter.policy = Idle()
        return drafter
    [report] = assert_greedy_equivalent(factory, families=("llama",), prompts=2)
    assert report.gamma == GAMMA and report.depth.deepest_drafted == GAMMA
    with pytest.raises(AssertionError, match=r"Chain drafted nothing .* at its own policy\)"):
        assert_greedy_equivalent(factory, families=("llama",), prompts=2, gamma=None)


class Chain(BaseDrafter):
    """Proposes ``gamma`` copies of a fixed token: every pass drafts exactly gamma tokens, a chain."""

    def propose(self, ctx, gamma):
        return Draft.chain([5] * gamma)


@pytest.mark.parametrize("gamma", [1, 2, 5])
def test_the_report_counts_passes_tokens_and_positions_verified_by_depth(gamma):
    [report] = assert_greedy_equivalent(lambda t: Chain(policy="auto"), families=("llama",), prompts=3,
                                        max_new_tokens=10, gamma=gamma)
    stats = report.depth
    assert stats.requests == 3 and stats.trees == 0
    assert stats.deepest_drafted == gamma and stats.drafted[0] == stats.passes  # the budget caps the last passes
    assert report.proposed_tokens == sum(stats.drafted)
    assert len(stats.verified) >= 1 and stats.verified[0] == stats.passes  # depth 1 is verified in every pass
    assert f"{report.proposed_tokens} draft tokens" in report.describe()
    assert f"positions verified by depth {stats.verified}" in report.describe()
    assert f"Chain at gamma {gamma}: {stats.passes} drafted passes" in report.describe()


def test_plain_decoding_is_not_asked_to_draft(bf16_case):
    report = compare_greedy(bf16_case, None)
    assert report.drafter == "plain" and report.depth is None and report.drafted_passes == 0
    check_report(report)
