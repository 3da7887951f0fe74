"""Draft-length policies: the protocol, make_policy and the cost-aware auto policy (the other schedules:
test_schedules.py)."""

import itertools

import pytest

from specfamily.core.policy import (
    AutoPolicy,
    Policy,
    make_policy,
)
from specfamily.core.theory import best_draft_length


@pytest.mark.parametrize("name", ["constant", "heuristic", "optimal", "auto"])
def test_make_policy_builds_a_policy_starting_at_gamma(name):
    policy = make_policy(name, 5)
    assert isinstance(policy, Policy)
    assert policy.next_gamma() == 5


def test_make_policy_rejects_unknown_names_and_bad_gamma():
    with pytest.raises(ValueError, match="auto, constant, heuristic, optimal"):
        make_policy("greedy", 4)
    for gamma in (-1, 0, 2.5, True, "4"):
        with pytest.raises(ValueError, match="gamma"):
            make_policy("constant", gamma)
    with pytest.raises(ValueError, match="unknown option"):
        make_policy("constant", 4, max_gamma=8)
    with pytest.raises(ValueError, match="accepted"):
        make_policy("heuristic", 4).update(2, 3)


# ---------------------------------------------------------------- auto (cost-aware)


def feed_auto(policy: AutoPolicy, passes: int, accepted_of, c: float) -> list[int]:
    """Run ``passes`` verifications; ``accepted_of(gamma)`` says how many draft tokens each one accepted."""
    asked = []
    for _ in range(passes):
        gamma = policy.next_gamma()
        asked.append(gamma)
        policy.update(gamma, accepted_of(gamma) if gamma else 0, c if gamma else None, tokens=gamma)
    return asked


def test_auto_drafts_its_start_gamma_until_c_is_known():
    policy = AutoPolicy(5)
    assert [policy.next_gamma() for _ in range(3)] == [5, 5, 5]
    policy.update(5, 2, None)
    assert policy.next_gamma() == 5


def test_auto_follows_the_theory_at_its_estimates():
    """After many all-accepted drafts at c = 0.1 and a flat verify cost it drafts what best_draft_length says."""
    policy = AutoPolicy(2, max_gamma=8, verify_cost=1.0)
    feed_auto(policy, 200, lambda g: g, 0.1)
    acceptance = policy.acceptance()
    assert acceptance[0] > 0.98
    assert policy.next_gamma() == best_draft_length(acceptance, policy.c_estimate, 1.0, policy.min_speedup)[0] == 8


def test_auto_drafts_nothing_when_speculation_cannot_pay_but_still_probes():
    """Nothing accepted, c = 0.5: every gamma predicts a slowdown, so it drafts 0 and probes after 5 passes, then
    after 10, 20, and at most every max_probe_every = 30."""
    policy = AutoPolicy(4, probe_every=5, max_probe_every=30)
    asked = feed_auto(policy, 100, lambda g: 0, 0.5)
    assert asked[0] == 4
    tail = asked[1:]
    assert [i for i, g in enumerate(tail) if g] == [4, 14, 34, 64, 94]
    assert all(g == 1 for g in tail if g)  # no length predicts a gain: a chain probe's steps (0.5 each) fit in no
    # margin (0.02 a pass of intervals up to 30): the shallowest probe


def test_auto_probes_often_again_once_drafting_pays():
    policy = AutoPolicy(1, max_gamma=4, probe_every=2, verify_cost=1.0)
    feed_auto(policy, 40, lambda g: 0, 0.5)
    assert policy.interval > 2
    feed_auto(policy, 400, lambda g: g, 0.05)  # probes accept everything: drafting pays again
    assert policy.next_gamma() > 0 and policy.interval == 2


def test_auto_counts_acceptance_per_depth():
    """Depth d is tried only when every shallower token was accepted: 3 of 4 at depth 1, then 1 of 3 at depth 2."""
    policy = AutoPolicy(2, max_gamma=2, prior_weight=1e-9)
    for accepted in (2, 1, 1, 0):
        policy.update(2, accepted, 0.1)
    assert policy.tried == [4, 3] and policy.accepted == [3, 1]
    assert policy.acceptance() == pytest.approx([0.75, 1 / 3])


def test_auto_verify_cost_scales_with_tree_width():
    """A tree of 3 tokens per depth is costed at verify_cost(3 gamma), not verify_cost(gamma)."""
    seen = []
    policy = AutoPolicy(2, max_gamma=4, verify_cost=lambda g: seen.append(g) or 1.0)
    policy.update(2, 1, 0.1, tokens=6)
    assert seen[0] == 6  # the pass just verified is costed at its own size
    policy.next_gamma()
    assert max(seen) == pytest.approx(4 * 1.6)  # gamma 4 is costed at 4 x the width


def test_auto_converts_each_pass_c_at_that_pass_size():
    """c is reported per pass (draft step / that pass's verification) and converted with that pass's own cost:
    a 1-token pass at c 0.2 and an 8-token pass (t = 2 t(1)) at c 0.1 both mean a step costs 0.2 one-token passes."""
    policy = AutoPolicy(2, max_gamma=8, verify_cost=lambda g: 1.0 + g / 8, c_smoothing=0.5)
    policy.update(1, 1, 0.2, tokens=1)
    policy.update(1, 1, 0.2, tokens=1)  # the second pass's c replaces the first's (a cold forward's): smoothed after
    first = policy.c_estimate
    policy.update(8, 8, 0.2 / (1 + 8 / 8), tokens=8)
    assert first == pytest.approx(0.2 * 1.125) and policy.c_estimate == pytest.approx(0.2 * 1.125 / 2 + 0.2 / 2)


def test_auto_counts_a_tree_as_the_verifier_tried_it():
    """A tree of depth 3 whose accepted depth-1 node is a leaf: depth 2 was never tried (not a rejection there)."""
    policy = AutoPolicy(2, max_gamma=3, prior_weight=1e-9)
    policy.update(3, 1, 0.1, tokens=5, verified=1)
    assert policy.tried == [1, 0, 0] and policy.accepted == [1, 0, 0]
    policy.update(3, 1, 0.1, tokens=5, verified=2)  # the accepted node had children: depth 2 tried and rejected
    assert policy.tried == [2, 1, 0] and policy.accepted == [2, 0, 0]


def test_auto_adds_the_drafters_overhead_to_each_drafted_pass():
    cheap = AutoPolicy(2, max_gamma=4, verify_cost=1.0)
    dear = AutoPolicy(2, max_gamma=4, verify_cost=1.0)
    for policy, overhead in ((cheap, 0.0), (dear, 1.5)):
        for _ in range(50):
            policy.update(2, 1, 0.05, tokens=2, overhead=overhead)
    assert cheap.next_gamma() > 0 and dear.next_gamma() == 0  # alpha ~0.5 pays 1.4x, not with 1.5 passes' overhead
    assert "drafted in" in dear.describe() and "predicted gain below" in dear.describe()


def run_requests(policy: AutoPolicy, requests: int, passes: int, accepted_of, c_of) -> list[list[int]]:
    """Requests of ``passes`` passes each, as the loop drives them (the last pass of a request is not reported)."""
    asked = []
    for _ in range(requests):
        policy.reset()
        lengths = []
        for index in range(passes):
            gamma = min(policy.next_gamma(), passes - index - 1)  # the loop's cut at the token budget
            lengths.append(gamma)
            if index < passes - 1 and gamma:
                policy.update(gamma, accepted_of(gamma), c_of(gamma), tokens=gamma)
        asked.append(lengths)
    return asked


def test_auto_drafts_again_in_later_requests_after_an_expensive_first_probe():
    """The issue's scenario: the first draft costs 5 passes a step (a cold start), every later one 0.05 and is
    accepted whole. The probe schedule counts passes across requests, so a later request probes and drafting
    resumes; a request-local count (passes per request < the interval) never probed again."""
    policy = AutoPolicy(2, max_gamma=4, verify_cost=1.0)
    costs = iter([5.0])
    asked = run_requests(policy, 40, 6, lambda g: g, lambda g: next(costs, 0.05))
    assert sum(asked[1]) == 0  # idle after the expensive draft
    drafting = [i for i, lengths in enumerate(asked) if any(lengths)]
    assert drafting[0] == 0 and len(drafting) >= 30, asked
    assert all(any(lengths) for lengths in asked[-10:])


def test_a_probe_cut_at_the_end_of_a_request_is_asked_again_and_does_not_double_the_interval():
    policy = AutoPolicy(1, max_gamma=2, probe_every=3, verify_cost=1.0)
    policy.update(1, 0, 2.0, tokens=1)  # nothing accepted, dear: idle from here
    assert [policy.next_gamma() for _ in range(2)] == [0, 0]
    assert policy.next_gamma() == 1  # the probe ... cut to 0 by the loop: never verified
    interval = policy.interval
    policy.reset()
    assert policy.next_gamma() == 1 and policy.interval == interval  # asked again in the next request
    policy.update(1, 0, 2.0, tokens=1)  # verified, still does not pay: now the interval doubles
    assert policy.interval == 2 * interval and policy.next_gamma() == 0


def test_auto_keeps_part_of_its_estimates_across_requests():
    policy = AutoPolicy(2, memory=0.5, prior_weight=1e-9)
    policy.update(2, 2, 0.1)
    policy.reset()
    assert policy.tried[:2] == [0.5, 0.5] and policy.c_estimate is not None


def test_a_requests_depth_one_estimate_starts_from_the_earlier_requests():
    """Depth 1 is smoothed towards the earlier requests' depth-1 acceptance (itself towards prior_alpha), not
    towards the fixed prior: the request's own tries join it at its end, and only the latest run_window count."""
    policy = AutoPolicy(1, max_gamma=1, verify_cost=1.0, prior_weight=2.0, run_window=16)
    assert policy.earlier_alpha() == pytest.approx(0.6)
    for _ in range(10):
        policy.update(1, 0, 0.05, tokens=1)
    assert policy.earlier_alpha() == pytest.approx(0.6)  # this request's counts are not its own prior
    policy.reset()
    assert policy.earlier == [10.0, 0.0] and policy.earlier_alpha() == pytest.approx(1.2 / 12)
    assert policy.acceptance()[0] == pytest.approx((0 + 2 * 0.1) / (5 + 2))
    for _ in range(12):
        policy.update(1, 1, 0.05, tokens=1)
    policy.reset()
    assert policy.earlier == pytest.approx([16.0, 16.0 * 12 / 22])  # the latest 16 tries, at the rate of all 22
    with pytest.raises(ValueError, match="run_window must be a finite number >= 0, got -1"):
        AutoPolicy(1, run_window=-1)


def test_a_drafter_that_never_pays_does_not_draft_again_at_each_requests_start():
    """No draft is ever accepted (c 0.05, a flat verify cost). With counts halved at each request and smoothed
    towards a fixed 0.6, a request's start looked like a 1.1x gain again and drafted until its own tries pulled the
    estimate down; towards the earlier requests' acceptance, a later request drafts only its probes."""
    policy = AutoPolicy(1, max_gamma=1, verify_cost=1.0, probe_every=16)
    asked = run_requests(policy, 20, 30, lambda g: 0, lambda g: 0.05)
    assert sum(asked[0]) >= 5  # the first request learns from the prior
    assert all(sum(lengths) <= 2 for lengths in asked[5:]), asked


def test_auto_charges_a_requests_start_until_it_drafts():
    """A draft model's prompt prefill (the catch-up of a request's first drafted pass) is paid once per request:
    spread over a 30-pass request it turns a 1.03x gain (alpha 0.17, c 0.11) into a loss, so the next request drafts
    nothing until a probe; with no start cost it drafts at once. Once a request drafted, its start is sunk."""
    asked = {}
    for start in (0.0, 2.0):
        policy = AutoPolicy(1, max_gamma=1, verify_cost=1.0, prior_weight=1e-9)
        policy.reset()
        for index in range(30):
            policy.next_gamma()
            policy.update(1, int(index % 6 == 0), 0.11, tokens=1, overhead=start if index == 0 else 0.0)
        assert policy.start_cost == pytest.approx(start) and policy.started
        policy.reset()
        asked[start] = [policy.next_gamma() for _ in range(3)]
        assert not policy.started and policy.request_passes == 30
    assert asked == {0.0: [1, 1, 1], 2.0: [0, 0, 0]}


@pytest.mark.parametrize("option", [{"memory": 1.5}, {"prior_weight": 0.0}, {"probe_every": 0}, {"max_gamma": 0},
                                    {"probe_every": 8, "max_probe_every": 4}])
def test_auto_rejects_bad_options(option):
    with pytest.raises(ValueError):
        AutoPolicy(2, **option)


# ---------------------------------------------------------------- auto: planning with the run's own pass costs


def curve(g: float) -> float:
    """A prior verify-cost curve: what an offline measurement might say (2% a draft token)."""
    return 1.0 + 0.02 * g


PLAIN = 0.010  # seconds of a plain pass in these runs


def feed_timed(policy: AutoPolicy, passes: int, accepted_of, c: float, seconds_of) -> list[int]:
    """``feed_auto`` as the loop drives a policy with the ``timed`` hook: each pass is timed (plain ones too) and
    reported before its update."""
    asked = []
    for _ in range(passes):
        gamma = policy.next_gamma()
        asked.append(gamma)
        policy.timed(gamma, seconds_of(gamma))
        policy.update(gamma, accepted_of(gamma) if gamma else 0, c if gamma else None, tokens=gamma)
    return asked


def one_in(n: int):
    """accepted_of: the first depth accepted in one draft out of n (alpha 1/n at depth 1), deterministic."""
    count = iter(range(10**9))
    return lambda g: int(next(count) % n == 0)


def test_auto_stops_drafting_when_its_passes_cost_more_than_the_curve_says():
    """Drafted passes measured at 1.3x what the curve predicts: a draft that the curve says pays 1.17x costs 1.3x
    more, so the policy drafts nothing, as best_draft_length at the corrected cost says; one that trusts the curve
    (no pass timed) keeps drafting."""
    trusting = AutoPolicy(1, max_gamma=4, verify_cost=curve, prior_weight=1e-9)
    measuring = AutoPolicy(1, max_gamma=4, verify_cost=curve, prior_weight=1e-9)
    feed_auto(trusting, 80, one_in(4), 0.05)
    feed_timed(measuring, 80, one_in(4), 0.05, lambda g: PLAIN * (1.3 * curve(g) if g else 1.0))
    assert measuring.costs.plain_seconds == pytest.approx(PLAIN)
    assert measuring.costs.scale(1) == pytest.approx(1.3)

    def corrected(g):
        return 1.3 * curve(g)

    expected = best_draft_length(measuring.acceptance(), measuring.c_estimate, corrected, measuring.min_speedup)
    assert expected == (0, 1.0)
    assert trusting.next_gamma() == 1 and trusting.acceptance()[0] == pytest.approx(0.25, abs=0.02)
    assert "predicted gain below" in measuring.describe()
    assert "curve 1.02 x measured 1.30" in measuring.describe()


def test_auto_speedup_at_a_uniformly_dearer_pass_is_the_curves_over_that_factor():
    """Every drafted pass 1.3x the curve and everything accepted: the same draft length still wins (c is measured
    against the same dearer pass), and the predicted speedup is the trusting one over 1.3."""
    trusting = AutoPolicy(2, max_gamma=6, verify_cost=curve, prior_weight=1e-9)
    measuring = AutoPolicy(2, max_gamma=6, verify_cost=curve, prior_weight=1e-9)
    feed_auto(trusting, 60, lambda g: g, 0.05)
    feed_timed(measuring, 60, lambda g: g, 0.05, lambda g: PLAIN * (1.3 * curve(g) if g else 1.0))
    gamma, speedup = best_draft_length(measuring.acceptance(), measuring.c_estimate,
                                       lambda g: 1.3 * curve(g), measuring.min_speedup)
    assert measuring.next_gamma() == gamma == trusting.next_gamma() == 6
    assert speedup == pytest.approx(trusting._choose()[2] / 1.3, rel=1e-6)


def test_auto_drafts_shorter_when_each_measured_draft_token_costs_more():
    """Passes that cost 15% of a plain pass per draft token (a per-row warp) on top of the curve: once those sizes
    are measured the policy drafts the length best_draft_length gives at the measured costs, shorter than the
    curve's."""
    def measured(g):
        return curve(g) + 0.15 * g

    def cycling():
        counts = itertools.cycle([4, 1, 2, 0])  # acceptance falls with depth: 3/4, 2/3, 1/2 ...
        return lambda g: min(next(counts), g)

    trusting = AutoPolicy(4, max_gamma=4, verify_cost=curve, prior_weight=1e-9)
    measuring = AutoPolicy(4, max_gamma=4, verify_cost=curve, prior_weight=1e-9, refresh_every=8)
    feed_auto(trusting, 40, cycling(), 0.02)
    for g in (1, 2, 3, 4):  # every size timed, as a run that tried them has
        measuring.timed(0, PLAIN)
        measuring.timed(g, PLAIN * measured(g))
    feed_timed(measuring, 40, cycling(), 0.02, lambda g: PLAIN * measured(g) if g else PLAIN)
    assert [measuring.costs.scale(g) * curve(g) for g in (1, 2, 3, 4)] == pytest.approx([measured(g) for g in
                                                                                        (1, 2, 3, 4)])
    gamma, _ = best_draft_length(measuring.acceptance(), measuring.c_estimate, measured, measuring.min_speedup)
    trusted, _ = best_draft_length(trusting.acceptance(), trusting.c_estimate, curve, trusting.min_speedup)
    measuring.timed(0, PLAIN)  # the refresh is not due: the next pass is the policy's choice
    assert trusting.next_gamma() == trusted == 4
    assert measuring.next_gamma() == gamma and 0 < gamma < trusted


def test_auto_makes_a_plain_pass_to_measure_t1_and_refreshes_it():
    """Timed drafted passes with no plain pass: the next pass is plain; then one every refresh_every drafted passes.
    The plain pass follows the run's latest plain passes (the median of the last window), so the cost of a drafted
    pass is measured against the plain pass of the cache length the run has now."""
    policy = AutoPolicy(3, max_gamma=4, verify_cost=curve, refresh_every=4)
    asked = feed_timed(policy, 12, lambda g: g, 0.05, lambda g: PLAIN * 1.2 if g else PLAIN)
    assert asked[:2] == [3, 0]  # until c is known it drafts its start gamma, then measures a plain pass
    assert [i for i, g in enumerate(asked) if g == 0] == [1, 6, 11]
    assert policy.costs.plain_seconds == pytest.approx(PLAIN)
    for _ in range(3):  # the cache grew: plain passes now take 12 ms
        policy.timed(0, 1.2 * PLAIN)
    assert policy.costs.plain_seconds == pytest.approx(1.2 * PLAIN)
    policy.timed(6, 1.2 * PLAIN * 1.3 * curve(6))  # a size not timed before
    assert policy.costs.scale(6) == pytest.approx(1.3)  # measured against 12 ms, not the 10 ms of earlier passes


def test_auto_without_timed_passes_plans_with_the_curve_and_never_forces_a_plain_pass():
    policy = AutoPolicy(2, max_gamma=6, verify_cost=curve, prior_weight=1e-9)
    asked = feed_auto(policy, 60, lambda g: g, 0.05)
    assert 0 not in asked and policy.costs.plain_seconds is None
    assert "the curve; no pass timed yet" in policy.describe()
