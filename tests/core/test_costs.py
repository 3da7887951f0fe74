import pytest

from specfamily.core.costs import MeasuredCost, measure_pass_seconds, measure_verify_cost, verify_cost_at
from specfamily.testing import tiny_target


def test_interpolation_is_linear_between_points_and_extends_past_the_last():
    curve = {0: 1.0, 4: 2.0, 8: 2.4}
    assert verify_cost_at(curve, 0) == 1.0 and verify_cost_at(curve, 2) == pytest.approx(1.5)
    assert verify_cost_at(curve, 6) == pytest.approx(2.2) and verify_cost_at(curve, 12) == pytest.approx(2.8)
    assert verify_cost_at({}, 5) == 1.0
    assert verify_cost_at({0: 1.0, 4: 0.9}, 100) == 0.9  # never extrapolated below the last measurement


def test_measured_curve_has_every_size_and_ratio_one_at_zero():
    target = tiny_target("llama", vocab_size=16)
    curve = measure_verify_cost(target, list(range(10)), [1, 3], repeats=2)
    assert sorted(curve) == [0, 1, 3] and curve[0] == 1.0 and all(v > 0 for v in curve.values())
    seconds = measure_pass_seconds(target, list(range(10)), [2], repeats=1, features=True)
    assert sorted(seconds) == [0, 2] and all(v > 0 for v in seconds.values())
    assert target.cached_length == 0  # left reset


def test_a_context_too_long_for_the_positions_is_refused():
    target = tiny_target("gpt2", vocab_size=16)  # 256 positions
    with pytest.raises(ValueError, match="leaves no room to time passes of up to 9 tokens"):
        measure_verify_cost(target, [i % 16 for i in range(250)], [8], repeats=2)


def test_the_timing_context_has_the_asked_length_whatever_the_prompt():
    """Short prompts are repeated, long ones cut to their last tokens, and room is left for the timed passes."""
    from specfamily.core.costs import timing_context

    target = tiny_target("llama", 16)  # 256 positions
    assert timing_context(target, [1, 2, 3], 7, [1, 2], repeats=1) == [3, 1, 2, 3, 1, 2, 3]
    assert timing_context(target, list(range(10)), 4, [1], repeats=1) == [6, 7, 8, 9]
    room = 256 - (5 + 1) * 3 - 8 - 1  # sizes {0, 4, 8}, 5 repeats
    assert len(timing_context(target, [5], 1000, [4, 8], repeats=5)) == room


def test_measured_cost_scales_the_prior_per_size_against_the_latest_plain_passes():
    costs = MeasuredCost(window=3)
    assert costs.scale(4) == 1.0 and costs.plain_seconds is None
    assert not costs.observe(4, 0.0132, 1.1)  # nothing to compare a drafted pass with yet: kept for the plain one
    assert costs.scale(4) == 1.0
    assert costs.observe(0, 0.010, 1.0) and costs.plain_seconds == 0.010
    assert costs.points == ((4, pytest.approx(1.2)),)
    costs = MeasuredCost(window=3)
    costs.observe(0, 0.010, 1.0)
    costs.observe(2, 0.013, 1.04)
    costs.observe(6, 0.018, 1.2)
    assert costs.scale(2) == pytest.approx(1.25) and costs.scale(6) == pytest.approx(1.5)
    assert costs.scale(4) == pytest.approx(1.375)  # linear between the sizes measured
    assert costs.scale(1) == pytest.approx(1.25) and costs.scale(32) == pytest.approx(1.5)  # constant past them
    costs.observe(2, 0.130, 1.04)  # one preempted pass: the median of the last 3 does not follow it
    costs.observe(2, 0.013, 1.04)
    assert costs.scale(2) == pytest.approx(1.25)
    for seconds in (0.012, 0.012):  # the cache grew: the plain pass follows the latest plain passes
        costs.observe(0, seconds, 1.0)
    assert costs.plain_seconds == pytest.approx(0.012)
    assert not costs.observe(0, float("nan"), 1.0) and not costs.observe(2, 0.0, 1.04)


def test_measured_cost_refuses_a_bad_window():
    with pytest.raises(ValueError, match="window must be an integer >= 1, got 0"):
        MeasuredCost(window=0)


def test_a_fresh_pass_replaces_the_window_at_its_size_only():
    costs = MeasuredCost(window=5)
    costs.observe(0, 0.010, 1.0)
    for _ in range(5):
        costs.observe(2, 0.030, 1.0)
        costs.observe(4, 0.030, 1.0)
    assert costs.observe(2, 0.010, 1.0)  # one pass joins a window of five: the median stays
    assert costs.scale(2) == pytest.approx(3.0)
    assert costs.observe(2, 0.010, 1.0, fresh=True)
    assert costs.scale(2) == pytest.approx(1.0) and costs.scale(4) == pytest.approx(3.0)


def test_the_measured_curve_is_fitted_never_falling_as_g_grows():
    """One measurement read 1.28 at one draft token and 1.10 at two: pooled with 1.13 at three, all read 1.17; g = 0
    keeps its 1, a monotone curve is left as it is, and a point under 1 is raised to it."""
    from specfamily.core.costs import monotone_curve

    fitted = monotone_curve({0: 1.0, 1: 1.28, 2: 1.10, 3: 1.13, 4: 1.26})
    assert list(fitted) == [0, 1, 2, 3, 4] and fitted[0] == 1.0 and fitted[4] == pytest.approx(1.26)
    assert [fitted[g] for g in (1, 2, 3)] == pytest.approx([(1.28 + 1.10 + 1.13) / 3] * 3)
    assert monotone_curve({0: 1.0, 2: 1.1, 8: 1.5}) == {0: 1.0, 2: 1.1, 8: 1.5}
    assert monotone_curve({0: 1.0, 1: 0.9, 2: 0.95}) == {0: 1.0, 1: 1.0, 2: 1.0}
    assert monotone_curve({}) == {} and monotone_curve({0: 1.0}) == {0: 1.0}


def test_the_policy_curve_a_target_keeps_is_the_monotone_fit_of_its_measurement(monkeypatch):
    import specfamily.core.costs as costs

    target = tiny_target("llama", vocab_size=16)
    monkeypatch.setattr(costs, "measure_verify_cost", lambda *a, **k: {0: 1.0, 1: 1.3, 2: 1.1, 4: 1.5})
    curve = costs.target_cost_curve(target, list(range(10)))
    assert target.verify_costs == pytest.approx({0: 1.0, 1: 1.2, 2: 1.2, 4: 1.5})
    assert curve(1) == pytest.approx(1.2) and curve(3) == pytest.approx(1.35)
