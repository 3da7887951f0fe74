"""Bootstrap 95% intervals of the report's ratios: tau and speedup, resampling prompts.

The unit of resampling is a question (its turns move together). Both statistics are ratios of sums over the
resampled prompts: tau = new tokens / target passes; speedup = (the arm's tokens / seconds) / (plain decoding's) over
the same prompts (paired). Percentile intervals from ``scipy.stats.bootstrap`` with a fixed seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_UNITS = 3  # fewer prompts than this: no interval
SEED = 0


@dataclass(frozen=True)
class Interval:
    """A bootstrap confidence interval; nan ends when there were too few prompts."""

    low: float = math.nan
    high: float = math.nan

    @property
    def known(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def __str__(self) -> str:
        return f"{self.low:.2f}-{self.high:.2f}" if self.known else "-"


NO_INTERVAL = Interval()


def _ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.sum(numerator, axis=axis) / np.sum(denominator, axis=axis)


def _speedup_statistic(tokens, seconds, plain_tokens, plain_seconds, axis: int = -1) -> np.ndarray:
    return _ratio_of_sums(tokens, seconds, axis) / _ratio_of_sums(plain_tokens, plain_seconds, axis)


def bootstrap_interval(
    columns: Sequence[Sequence[float]], statistic: Callable[..., np.ndarray], seed: int = SEED,
    resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
) -> Interval:
    """Percentile interval of ``statistic(*columns, axis=-1)`` over prompts resampled jointly (paired)."""
    data = [np.asarray(column, dtype=np.float64) for column in columns]
    if len(data[0]) < MIN_UNITS or any(not np.all(np.isfinite(column)) for column in data):
        return NO_INTERVAL
    from scipy.stats import bootstrap

    result = bootstrap(data, statistic, n_resamples=resamples, paired=True, vectorized=True, method="percentile",
                       confidence_level=confidence, rng=np.random.default_rng(seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return Interval(low, high) if math.isfinite(low) and math.isfinite(high) else NO_INTERVAL


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], seed: int = SEED) -> Interval:
    """Interval of sum(numerator) / sum(denominator), one entry per prompt (tau: new tokens / passes)."""
    if any(d <= 0 for d in denominator):
        return NO_INTERVAL
    return bootstrap_interval([numerator, denominator], _ratio_of_sums, seed)


def speedup_interval(
    tokens: Sequence[float], seconds: Sequence[float], plain_tokens: Sequence[float], plain_seconds: Sequence[float],
    seed: int = SEED,
) -> Interval:
    """Interval of the throughput ratio to plain decoding, one entry per prompt in each sequence (paired)."""
    if any(s <= 0 for s in [*seconds, *plain_seconds]):
        return NO_INTERVAL
    return bootstrap_interval([tokens, seconds, plain_tokens, plain_seconds], _speedup_statistic, seed)
