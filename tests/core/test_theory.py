"""Leviathan et al. (2022) formulas against worked numbers and exact enumeration."""

import math

import pytest
import torch

from specfamily.core import theory
from specfamily.core.theory import acceptance_rate, expected_speedup, expected_tokens_per_pass, optimal_gamma


def enumerated_tokens_per_pass(alpha: float, gamma: int) -> float:
    """E[accepted + 1] with P(k accepted) = alpha^k (1 - alpha) for k < gamma, alpha^gamma for k = gamma."""
    expected = sum((k + 1) * alpha**k * (1 - alpha) for k in range(gamma))
    return expected + (gamma + 1) * alpha**gamma


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.7, 0.95])
@pytest.mark.parametrize("gamma", [0, 1, 2, 4, 7])
def test_tokens_per_pass_matches_enumeration(alpha, gamma):
    assert expected_tokens_per_pass(alpha, gamma) == pytest.approx(enumerated_tokens_per_pass(alpha, gamma), rel=1e-12)


def test_tokens_per_pass_edges():
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(0.7, 0) == 1.0
    assert expected_tokens_per_pass(0.3, 4) == pytest.approx(1.4251, rel=1e-12)  # (1 - 0.3^5) / 0.7


def test_speedup_textbook_alpha_07_c_01():
    assert expected_speedup(0.7, 2, 0.1) == pytest.approx(1.825, rel=1e-12)  # 2.19 / 1.2
    assert expected_speedup(0.7, 4, 0.1) == pytest.approx(2.0, abs=0.02)
    assert expected_speedup(0.7, 4, 0.1) == pytest.approx(0.83193 / 0.3 / 1.4, rel=1e-12)
    assert expected_speedup(0.7, 12, 0.1) == pytest.approx(1.5, abs=0.001)
    assert optimal_gamma(0.7, 0.1) == 4


def test_speedup_poor_drafter_is_a_slowdown():
    assert expected_speedup(0.3, 4, 0.5) == pytest.approx(1.4251 / 3.0, rel=1e-12)
    assert expected_speedup(0.3, 4, 0.5) == pytest.approx(0.475, abs=0.001)


def test_speedup_with_measured_verify_cost():
    assert expected_speedup(0.7, 4, 0.1, verify_cost=None) == expected_speedup(0.7, 4, 0.1, verify_cost=1.0)
    assert expected_speedup(0.7, 4, 0.1, verify_cost=2.0) == pytest.approx(0.83193 / 0.3 / 2.4, rel=1e-12)
    cost_curve = lambda gamma: 1.0 + 0.25 * gamma  # noqa: E731
    assert expected_speedup(0.7, 2, 0.1, verify_cost=cost_curve) == pytest.approx(2.19 / 1.7, rel=1e-12)


def test_optimal_gamma_with_a_cost_curve_is_shorter():
    cost_curve = lambda gamma: 1.0 + 0.25 * gamma  # noqa: E731  t(gamma + 1) / t(1) grows on a CPU
    # gamma 1: 1.7 / 1.35 = 1.259, gamma 2: 2.19 / 1.7 = 1.288, gamma 3: 2.533 / 2.05 = 1.236
    assert optimal_gamma(0.7, 0.1, verify_cost=cost_curve) == 2


def test_optimal_gamma_is_the_brute_force_argmax():
    for alpha in (0.2, 0.5, 0.8, 0.9, 0.99):
        for c in (0.0, 0.02, 0.1, 0.4):
            best = max(range(1, 33), key=lambda g, a=alpha, c=c: (expected_speedup(a, g, c), -g))
            assert optimal_gamma(alpha, c) == best


def test_optimal_gamma_returns_argmax_even_without_speedup():
    gamma = optimal_gamma(0.3, 0.5)
    assert gamma == 1
    assert expected_speedup(0.3, gamma, 0.5) == pytest.approx(1.3 / 1.5)
    assert optimal_gamma(0.0, 0.1) == 1


def test_optimal_gamma_capped_by_max_gamma():
    assert optimal_gamma(1.0, 0.0) == 32
    assert optimal_gamma(1.0, 0.0, max_gamma=5) == 5
    assert optimal_gamma(0.7, 0.1, max_gamma=3) == 3


def test_acceptance_rate_textbook_example():
    p = [0.42, 0.26, 0.16, 0.10, 0.06]
    q = [0.20, 0.45, 0.10, 0.05, 0.20]
    assert acceptance_rate(p, q) == pytest.approx(0.67, abs=1e-12)
    assert acceptance_rate(torch.tensor(p), torch.tensor(q)) == pytest.approx(0.67, abs=1e-6)
    assert acceptance_rate(q, p) == pytest.approx(0.67, abs=1e-12)
    assert acceptance_rate(p, p) == pytest.approx(1.0)
    assert acceptance_rate([1.0, 0.0], [0.0, 1.0]) == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: expected_tokens_per_pass(-0.1, 4),
        lambda: expected_tokens_per_pass(1.1, 4),
        lambda: expected_tokens_per_pass(math.nan, 4),
        lambda: expected_tokens_per_pass(0.5, -1),
        lambda: expected_tokens_per_pass(0.5, 2.5),
        lambda: expected_speedup(0.5, 4, -0.1),
        lambda: expected_speedup(0.5, 4, math.inf),
        lambda: expected_speedup(0.5, 4, 0.1, verify_cost=0.0),
        lambda: expected_speedup(0.5, 4, 0.1, verify_cost=lambda gamma: -1.0),
        lambda: optimal_gamma(1.5, 0.1),
        lambda: optimal_gamma(0.5, -1.0),
        lambda: optimal_gamma(0.5, 0.1, max_gamma=0),
        lambda: acceptance_rate([0.5, 0.5], [1.0]),
        lambda: acceptance_rate([1.5, -0.5], [0.5, 0.5]),
    ],
)
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_error_messages_name_the_problem():
    with pytest.raises(ValueError, match="alpha"):
        theory.expected_speedup(2.0, 4, 0.1)
    with pytest.raises(ValueError, match="gamma"):
        theory.expected_speedup(0.5, -3, 0.1)
    with pytest.raises(ValueError, match="c must"):
        theory.expected_speedup(0.5, 4, -0.1)



def test_tokens_by_depth_equals_the_iid_formula_at_a_constant_rate():
    for alpha in (0.0, 0.3, 0.9, 1.0):
        for gamma in range(6):
            assert theory.expected_tokens_by_depth([alpha] * 6, gamma) == pytest.approx(
                theory.expected_tokens_per_pass(alpha, gamma))


def test_tokens_by_depth_uses_conditional_rates():
    """Depth 1 accepted half the time, depth 2 always after that: 1 + 0.5 + 0.5."""
    assert theory.expected_tokens_by_depth([0.5, 1.0], 2) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="exceeds the 2 depths"):
        theory.expected_tokens_by_depth([0.5, 1.0], 3)


def test_best_draft_length_is_zero_when_nothing_pays():
    assert theory.best_draft_length([0.1] * 8, 0.5) == (0, 1.0)
    gamma, speedup = theory.best_draft_length([0.8] * 8, 0.05, lambda g: 1 + 0.1 * g)
    brute = max(range(1, 9), key=lambda g: theory.expected_speedup(0.8, g, 0.05, lambda x: 1 + 0.1 * x))
    assert gamma == brute and speedup == pytest.approx(theory.expected_speedup(0.8, brute, 0.05, lambda x: 1 + 0.1 * x))
    assert theory.best_draft_length([0.8] * 8, 0.05, 1.0, min_speedup=100.0) == (0, 1.0)

