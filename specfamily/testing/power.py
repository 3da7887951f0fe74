"""How many samples a conformance run needs: the power of a chi-square goodness-of-fit test.

The suite runs ``tests_per_run(n)`` chi-square tests per sampling config (n per-position marginals, n - 1 adjacent
pairs, the joint) and fails when any p-value is below ``significance / tests`` (Bonferroni). It is sized so that a
drafter moving the law of the token at any one position by total variation ``delta`` is caught with probability
``power``: the Pearson statistic of N samples from p' tested against p is asymptotically noncentral chi-square with
noncentrality N * chi2(p' || p) >= 4 N delta^2, so ``ncx2.sf(critical value, V - 1, 4 N delta^2)`` bounds the power
from below.

An error only at draft depth d is tested on the tokens decided at level d (:mod:`specfamily.testing.levels`):
:func:`level_power` with N_d such tokens, the run sized by ``samples_for_power`` from the pilot's
:func:`rate_lower_bound`. A position's marginal sees it diluted by the share f of samples decided there at depth d
(:func:`diluted_power`); :func:`share_for_power` and :func:`depth_samples` keep the per-request sizing for
comparison.
"""

from __future__ import annotations

from scipy import optimize, stats

DEFAULT_DELTA = 0.1  # total variation at one position the suite is sized to catch
DEFAULT_POWER = 0.99
DEFAULT_SIGNIFICANCE = 1e-3  # family-wise, per sampling config
DEFAULT_DEPTH_POWER = 0.9  # against an error that appears only at the deepest tested depth


def tests_per_run(n_tokens: int, levels: int = 0) -> int:
    """Chi-square tests per sampling config: n marginals, n - 1 adjacent pairs, one joint, and two (token and rank
    space) for each of ``levels`` levels tested on their own."""
    return 2 * n_tokens + 2 * levels


def detection_power(samples: int, delta: float, cells: int, alpha: float) -> float:
    """Lower bound on the power of a level-``alpha`` chi-square test over ``cells`` cells with ``samples``
    samples against any law at total variation ``delta`` from the null (noncentrality 4 N delta^2)."""
    df = cells - 1
    critical = stats.chi2.isf(alpha, df)
    return float(stats.ncx2.sf(critical, df, 4.0 * samples * delta**2))


def samples_for_power(delta: float = DEFAULT_DELTA, cells: int = 8, alpha: float = DEFAULT_SIGNIFICANCE / 10,
                      power: float = DEFAULT_POWER) -> int:
    """The fewest samples whose level-``alpha`` test over ``cells`` cells detects a total-variation deviation
    ``delta`` with probability >= ``power`` (by :func:`detection_power`)."""
    if not 0 < delta <= 1 or not 0 < alpha < 1 or not 0 < power < 1 or cells < 2:
        raise ValueError(f"need 0 < delta <= 1, 0 < alpha < 1, 0 < power < 1, cells >= 2; got "
                         f"{delta}, {alpha}, {power}, {cells}")
    df = cells - 1
    critical = stats.chi2.isf(alpha, df)
    noncentrality = optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 1e-9, 1e6)
    samples = int(noncentrality / (4.0 * delta**2))
    while detection_power(samples, delta, cells, alpha) < power:  # the floor can land just below
        samples += 1
    return samples


def run_samples(vocab: int, n_tokens: int, significance: float = DEFAULT_SIGNIFICANCE,
                delta: float = DEFAULT_DELTA, power: float = DEFAULT_POWER, levels: int = 0) -> int:
    """Samples per sampling config of a conformance run: a position's marginal (``vocab`` cells) at the
    Bonferroni level ``significance / tests_per_run(n_tokens, levels)``."""
    return samples_for_power(delta, vocab, significance / tests_per_run(n_tokens, levels), power)


def level_power(tokens: int, delta: float, cells: int, alpha: float) -> float:
    """Lower bound on the power of the level-conditional test of ``tokens`` tokens decided at one level against a
    deviation of total variation ``delta`` in their pooled law (0 without tokens)."""
    return detection_power(tokens, delta, cells, alpha) if tokens > 0 else 0.0


def diluted_power(samples: int, share: float, delta: float, cells: int, alpha: float) -> float:
    """The power a position's marginal has when a share ``share`` of the samples carries the deviation ``delta``
    (diluted to share * delta): the old per-request sizing's claim, for comparison."""
    return detection_power(samples, share * delta, cells, alpha) if share > 0 else 0.0


def rate_lower_bound(counts: list[int], z: float = 2.0) -> float:
    """Lower bound (mean minus ``z`` standard errors, at least 0) on the tokens per sample decided at a level, from
    a pilot's per-sample ``counts``: taken low, so the run it sizes does not fall short by the pilot's own noise."""
    if not counts:
        return 0.0
    n = len(counts)
    mean = sum(counts) / n
    variance = sum((c - mean) ** 2 for c in counts) / max(n - 1, 1)
    return max(0.0, mean - z * (variance / n) ** 0.5)


def noncentrality_for_power(cells: int, alpha: float, power: float) -> float:
    """The noncentrality at which a level-``alpha`` chi-square test over ``cells`` cells has ``power``."""
    df = cells - 1
    critical = stats.chi2.isf(alpha, df)
    return optimize.brentq(lambda lam: stats.ncx2.sf(critical, df, lam) - power, 1e-9, 1e6)


def share_for_power(samples: int, delta: float, cells: int, alpha: float, power: float = DEFAULT_DEPTH_POWER) -> float:
    """The smallest share f of samples reaching a depth for which ``samples`` samples catch an error of conditional
    total variation ``delta`` at that depth (diluted to f * delta) with ``power`` (> 1: no share suffices)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    return (noncentrality_for_power(cells, alpha, power) / (4.0 * samples)) ** 0.5 / delta


def depth_samples(share: float, delta: float, cells: int, alpha: float, power: float = DEFAULT_DEPTH_POWER) -> int:
    """Samples needed to catch an error of conditional total variation ``delta`` that appears only at a depth
    reached by a share ``share`` of the samples, with ``power`` (a share of 0 needs infinitely many: raises)."""
    if not 0 < share <= 1:
        raise ValueError(f"no sample count has power at a depth reached by a share {share!r} of the samples")
    return samples_for_power(min(1.0, share * delta), cells, alpha, power)


def share_lower_bound(share: float, samples: int, z: float = 2.0) -> float:
    """Wilson score lower bound on a share measured over ``samples`` samples (``z`` standard errors): a pilot
    run's estimate, taken low, so the run it sizes does not fall short by the pilot's own noise."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    z2 = z * z / samples
    centre = share + z2 / 2
    spread = z * (share * (1 - share) / samples + z2 / (4 * samples)) ** 0.5
    return max(0.0, (centre - spread) / (1 + z2))
