"""The draft-length schedules that are not cost-aware: a constant gamma, Hugging Face's heuristic schedule and the
theory-optimal gamma at running estimates (``specfamily.core.policy_protocol`` holds the protocol;
``specfamily.core.policy`` the cost-aware ``auto`` policy and ``make_policy``, which builds these by name)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specfamily.core.theory import VerifyCost, check_int, optimal_gamma


def check_update(proposed: int, accepted: int) -> tuple[int, int]:
    proposed = check_int(proposed, "proposed", 0)
    accepted = check_int(accepted, "accepted", 0)
    if accepted > proposed:
        raise ValueError(f"accepted ({accepted}) cannot exceed proposed ({proposed})")
    return proposed, accepted


@dataclass
class ConstantPolicy:
    """Always the same gamma."""

    gamma: int

    def __post_init__(self) -> None:
        self.gamma = check_int(self.gamma, "gamma", 1)

    def reset(self) -> None:
        pass

    def next_gamma(self) -> int:
        return self.gamma

    def update(self, proposed: int, accepted: int, c: float | None = None, tokens: int | None = None,
               verified: int | None = None, overhead: float | None = None) -> None:
        check_update(proposed, accepted)


@dataclass
class HeuristicPolicy:
    """Hugging Face assisted generation's default schedule.

    Start at ``gamma``; +2 after a verification that accepted every proposed token, -1 (floor 1)
    otherwise; ``max_gamma`` caps the growth (None: no cap, as in transformers). ``reset``
    restores the start value. Verifications of an empty draft change nothing.
    """

    gamma: int
    max_gamma: int | None = None
    current: int = field(init=False)

    def __post_init__(self) -> None:
        self.gamma = check_int(self.gamma, "gamma", 1)
        if self.max_gamma is not None:
            self.max_gamma = check_int(self.max_gamma, "max_gamma", self.gamma)
        self.current = self.gamma

    def reset(self) -> None:
        self.current = self.gamma

    def next_gamma(self) -> int:
        return self.current

    def update(self, proposed: int, accepted: int, c: float | None = None, tokens: int | None = None,
               verified: int | None = None, overhead: float | None = None) -> None:
        proposed, accepted = check_update(proposed, accepted)
        if proposed == 0:
            return
        if accepted == proposed:
            self.current += 2
            if self.max_gamma is not None:
                self.current = min(self.current, self.max_gamma)
        else:
            self.current = max(1, self.current - 1)


def estimate_alpha(accepted: float, rejections: float, prior_alpha: float, prior_weight: float) -> float:
    """Per-position acceptance: accepted / (accepted + rejections), smoothed by pseudo-observations.

    A draft of depth d with a accepted tokens is a runs of successes ended by one failure when
    a < d, so the geometric maximum-likelihood estimate counts one rejection per such draft.
    """
    return (accepted + prior_alpha * prior_weight) / (accepted + rejections + prior_weight)


@dataclass
class OptimalPolicy:
    """``theory.optimal_gamma`` at running estimates of alpha and c.

    alpha: accepted tokens / (accepted tokens + verifications that ended in a rejection), with a
    prior of ``prior_alpha`` over ``prior_weight`` pseudo-observations. c: an exponential moving
    average (weight ``c_smoothing`` on the newest value) of the c reported to ``update``, or a
    fixed ``c`` when given (reproducible schedules). Until c is known, ``gamma`` is used.
    ``verify_cost`` (float or callable gamma -> t(gamma + 1) / t(1)) is passed to the theory.
    ``reset`` forgets the estimates, so a request's schedule does not depend on earlier requests.
    """

    gamma: int
    max_gamma: int = 32
    verify_cost: VerifyCost = None
    c: float | None = None
    prior_alpha: float = 0.6
    prior_weight: float = 4.0
    c_smoothing: float = 0.3
    accepted: int = field(init=False, default=0)
    rejections: int = field(init=False, default=0)
    c_estimate: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.gamma = check_int(self.gamma, "gamma", 1)
        self.max_gamma = check_int(self.max_gamma, "max_gamma", 1)
        if not 0.0 <= self.prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha must be in [0, 1], got {self.prior_alpha!r}")
        if not (math.isfinite(self.prior_weight) and self.prior_weight > 0):
            raise ValueError(f"prior_weight must be a finite number > 0, got {self.prior_weight!r}")
        if not 0.0 < self.c_smoothing <= 1.0:
            raise ValueError(f"c_smoothing must be in (0, 1], got {self.c_smoothing!r}")
        if self.c is not None and not (math.isfinite(self.c) and self.c >= 0):
            raise ValueError(f"c must be a finite number >= 0, got {self.c!r}")
        self.reset()

    @property
    def alpha(self) -> float:
        return estimate_alpha(self.accepted, self.rejections, self.prior_alpha, self.prior_weight)

    def reset(self) -> None:
        self.accepted = 0
        self.rejections = 0
        self.c_estimate = self.c

    def next_gamma(self) -> int:
        if self.c_estimate is None:
            return min(self.gamma, self.max_gamma)
        return optimal_gamma(self.alpha, self.c_estimate, self.verify_cost, self.max_gamma)

    def update(self, proposed: int, accepted: int, c: float | None = None, tokens: int | None = None,
               verified: int | None = None, overhead: float | None = None) -> None:
        proposed, accepted = check_update(proposed, accepted)
        self.accepted += accepted
        self.rejections += int(accepted < proposed)
        if self.c is None and proposed and c is not None and math.isfinite(c) and c >= 0:  # an empty draft's c is
            previous = self.c_estimate  # its proposal's time, not a draft step's
            self.c_estimate = c if previous is None else previous + self.c_smoothing * (c - previous)
