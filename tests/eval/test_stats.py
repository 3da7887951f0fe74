"""Bootstrap intervals of tau and speedup: checked against scipy directly and an independent numpy bootstrap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from specfamily.eval.stats import MIN_UNITS, ratio_interval, speedup_interval

RNG = np.random.default_rng(7)
N = 12
TOKENS = RNG.integers(40, 129, N).astype(float)
SECONDS = TOKENS * RNG.uniform(0.010, 0.030, N)  # the arm: 10-30 ms a token, varying by prompt
PLAIN_TOKENS = TOKENS.copy()
PLAIN_SECONDS = TOKENS * RNG.uniform(0.018, 0.026, N)
PASSES = np.ceil(TOKENS / RNG.uniform(1.2, 3.5, N))


def _numpy_percentile_bootstrap(columns, statistic, resamples=40000, seed=123):
    """Resample prompt indices with replacement, the same indices for every column; 2.5 and 97.5 percentiles."""
    index = np.random.default_rng(seed).integers(0, len(columns[0]), (resamples, len(columns[0])))
    values = statistic(*(np.asarray(c)[index] for c in columns))
    return np.percentile(values, [2.5, 97.5])


def _speedup(tokens, seconds, plain_tokens, plain_seconds, axis=-1):
    return (tokens.sum(axis) / seconds.sum(axis)) / (plain_tokens.sum(axis) / plain_seconds.sum(axis))


def test_speedup_interval_is_scipys_paired_percentile_bootstrap_of_the_ratio_of_sums():
    interval = speedup_interval(TOKENS, SECONDS, PLAIN_TOKENS, PLAIN_SECONDS)
    direct = scipy_stats.bootstrap((TOKENS, SECONDS, PLAIN_TOKENS, PLAIN_SECONDS), _speedup, paired=True,
                                   vectorized=True, n_resamples=2000, method="percentile",
                                   rng=np.random.default_rng(0)).confidence_interval
    assert (interval.low, interval.high) == pytest.approx((direct.low, direct.high), rel=1e-12)
    low, high = _numpy_percentile_bootstrap([TOKENS, SECONDS, PLAIN_TOKENS, PLAIN_SECONDS], _speedup)
    assert interval.low == pytest.approx(low, rel=0.02) and interval.high == pytest.approx(high, rel=0.02)
    point = _speedup(TOKENS, SECONDS, PLAIN_TOKENS, PLAIN_SECONDS)
    assert interval.low < point < interval.high


def test_pairing_matters_when_prompts_differ_in_length():
    """Long prompts are slow for both arms: paired resampling cancels that, unpaired would not."""
    tokens = np.array([20, 20, 20, 200, 200, 200, 60, 60], dtype=float)
    seconds = tokens * 0.01
    plain_seconds = tokens * 0.02  # exactly 2x on every prompt
    interval = speedup_interval(tokens, seconds, tokens, plain_seconds)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)


def test_tau_interval_is_a_ratio_of_sums_over_prompts():
    interval = ratio_interval(TOKENS, PASSES)
    low, high = _numpy_percentile_bootstrap([TOKENS, PASSES], lambda a, b: a.sum(-1) / b.sum(-1))
    assert interval.low == pytest.approx(low, rel=0.02) and interval.high == pytest.approx(high, rel=0.02)
    assert interval.low < TOKENS.sum() / PASSES.sum() < interval.high
    assert str(interval) == f"{interval.low:.2f}-{interval.high:.2f}"


def test_too_few_prompts_or_bad_values_give_no_interval():
    few = ratio_interval(TOKENS[: MIN_UNITS - 1], PASSES[: MIN_UNITS - 1])
    assert math.isnan(few.low) and math.isnan(few.high) and not few.known and str(few) == "-"
    assert not ratio_interval([1.0, 2.0, 3.0], [1.0, 0.0, 2.0]).known
    assert not speedup_interval([1, 2, 3], [1, 1, float("nan")], [1, 2, 3], [1, 1, 1]).known
