"""The schedules that are not cost-aware: constant, the HF heuristic schedule, and the theory-optimal gamma."""


import pytest

from specfamily.core.policy import Policy, make_policy
from specfamily.core.schedules import ConstantPolicy, HeuristicPolicy, OptimalPolicy, estimate_alpha
from specfamily.core.theory import optimal_gamma


def run_schedule(policy: Policy, accepted_pattern: list[int | None]) -> list[int]:
    """Gammas asked for, where each proposal gets `accepted` tokens accepted (None: all of them)."""
    gammas = []
    for accepted in accepted_pattern:
        gamma = policy.next_gamma()
        gammas.append(gamma)
        policy.update(gamma, gamma if accepted is None else accepted)
    return gammas


def test_constant_policy_never_changes():
    policy = ConstantPolicy(3)
    assert run_schedule(policy, [None, 0, 1, None, None]) == [3, 3, 3, 3, 3]


def test_heuristic_schedule_on_an_accept_pattern():
    policy = make_policy("heuristic", 4)
    # all accepted: +2; otherwise -1
    assert run_schedule(policy, [None, None, 3, 0, None, 2]) == [4, 6, 8, 7, 6, 8]
    assert policy.next_gamma() == 7
    policy.reset()
    assert policy.next_gamma() == 4


def test_heuristic_floor_cap_and_empty_drafts():
    policy = HeuristicPolicy(2)
    assert run_schedule(policy, [0, 0, 0, None, None]) == [2, 1, 1, 1, 3]
    assert policy.next_gamma() == 5
    policy.update(0, 0)  # the drafter had nothing to propose: no information
    assert policy.next_gamma() == 5
    capped = make_policy("heuristic", 4, max_gamma=7)
    assert run_schedule(capped, [None, None, None, 1]) == [4, 6, 7, 7]


def test_heuristic_counts_the_depth_actually_proposed():
    policy = HeuristicPolicy(6)
    policy.update(2, 2)  # the drafter proposed fewer than asked, all of them accepted
    assert policy.next_gamma() == 8


def test_alpha_estimate_with_prior():
    assert estimate_alpha(0, 0, 0.6, 4.0) == pytest.approx(0.6)
    assert estimate_alpha(7, 3, 0.6, 4.0) == pytest.approx(9.4 / 14)
    assert estimate_alpha(7000, 3000, 0.6, 4.0) == pytest.approx(0.7, abs=1e-4)


def test_optimal_uses_initial_gamma_until_c_is_known():
    policy = make_policy("optimal", 6)
    policy.update(6, 6)
    assert policy.next_gamma() == 6
    policy.update(6, 2, c=0.1)
    assert policy.next_gamma() == optimal_gamma(policy.alpha, 0.1)


def feed(policy: OptimalPolicy, accepted_per_10: int, c: float, rounds: int) -> None:
    """Depth-10 drafts whose accepted/(accepted + rejections) is exactly accepted_per_10 / 10."""
    rejections = 10 - accepted_per_10
    for _ in range(rounds):
        policy.update(10, accepted_per_10, c=c)  # one rejection
        for _ in range(rejections - 1):
            policy.update(10, 0, c=c)  # a rejection at the first token


@pytest.mark.parametrize("alpha_tenths, c", [(7, 0.1), (3, 0.5), (9, 0.05), (8, 0.2), (5, 0.02)])
def test_optimal_converges_to_theory(alpha_tenths, c):
    policy = OptimalPolicy(gamma=4)
    feed(policy, alpha_tenths, c, rounds=500)
    assert policy.alpha == pytest.approx(alpha_tenths / 10, abs=1e-3)
    assert policy.c_estimate == pytest.approx(c)
    assert policy.next_gamma() == optimal_gamma(alpha_tenths / 10, c)


def test_optimal_textbook_values():
    policy = OptimalPolicy(gamma=2)
    feed(policy, 7, 0.1, rounds=500)
    assert policy.next_gamma() == 4  # alpha 0.7, c 0.1
    policy.reset()
    assert policy.next_gamma() == 2
    feed(policy, 3, 0.5, rounds=500)
    assert policy.next_gamma() == 1  # alpha 0.3, c 0.5: no gamma pays off; the argmax is 1


def test_optimal_c_is_an_moving_average_or_fixed():
    policy = OptimalPolicy(gamma=4, c_smoothing=0.3)
    policy.update(4, 4, c=0.1)
    policy.update(4, 4, c=0.2)
    assert policy.c_estimate == pytest.approx(0.13)
    policy.update(4, 4, c=None)
    assert policy.c_estimate == pytest.approx(0.13)
    policy.update(0, 0, c=0.9)  # an empty draft's c is its proposal's time, not a draft step's
    assert policy.c_estimate == pytest.approx(0.13)
    fixed = make_policy("optimal", 4, c=0.1)
    assert fixed.next_gamma() == optimal_gamma(0.6, 0.1)  # the prior alpha
    fixed.update(4, 4, c=0.9)
    assert fixed.c_estimate == 0.1


def test_optimal_passes_verify_cost_and_caps_at_max_gamma():
    cost_curve = lambda gamma: 1.0 + 0.25 * gamma  # noqa: E731
    policy = make_policy("optimal", 4, verify_cost=cost_curve)
    feed(policy, 7, 0.1, rounds=500)
    assert policy.next_gamma() == optimal_gamma(0.7, 0.1, verify_cost=cost_curve) == 2
    perfect = make_policy("optimal", 4, max_gamma=12, prior_alpha=1.0)
    for _ in range(20):
        perfect.update(perfect.next_gamma(), perfect.next_gamma(), c=0.0)
    assert perfect.next_gamma() == 12


def test_optimal_rejects_bad_options():
    for options in ({"max_gamma": 0}, {"prior_alpha": 1.5}, {"prior_weight": 0.0}, {"c_smoothing": 0.0}, {"c": -1.0}):
        with pytest.raises(ValueError):
            make_policy("optimal", 4, **options)
