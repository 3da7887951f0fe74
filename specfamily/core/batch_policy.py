"""Draft length by load: the batched loop's choice of gamma for B live requests, for goodput, from measured costs.

Under load a target pass of B requests of n fed tokens each costs t(B, n), which on a CPU (and on a GPU once the
batch fills it) grows with the tokens fed, B n: verifying a draft for every request can cost more than the tokens
it gains. :class:`LoadCosts` learns t(B, n) from the run's own passes (medians of the latest few per (B, n);
elsewhere a curve over B n through the measured points, scaled by what this B measured against it), and the
seconds of one batched draft step per B. :class:`BatchPolicy` picks, for the B requests of a pass, the gamma
(0: a plain pass) with the most expected committed tokens per second for the whole batch,

    goodput(gamma) = sum_i E_i(gamma) / (gamma s(B) + t(B, 1 + gamma w)),

E_i from each request's per-depth acceptance as its own cost-aware policy (``auto``) keeps it (times the share of
passes its drafter proposed anything in, :func:`proposing`), w the draft tokens
per depth (1 for chains), s(B) a draft step's seconds. Nothing is configured: it makes a plain pass first at each
B, drafts one level (``explore``: the cheapest drafted pass to learn the cost of drafting from) while a drafted pass
cannot be predicted yet, re-measures the plain pass every ``refresh_every`` drafted passes (the caches grow) and,
while drafting does not pay at a load, drafts once every ``probe_every`` passes to keep the estimates current, twice
as rarely after each probe that did not make drafting pay (up to ``probe_every * 2**max_backoff``). Draft length
never changes a greedy text.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from specfamily.core.theory import expected_tokens_by_depth

__all__ = ["BatchPolicy", "LoadCosts", "fed_tokens", "goodput", "proposing"]


@dataclass
class LoadCosts:
    """Seconds of a batched pass, t(B, n) (B requests of n fed tokens each), and of one draft step for B requests,
    learned from timed passes: medians of the latest ``window`` observations."""

    window: int = 5
    passes: dict[tuple[int, int], deque] = field(default_factory=dict, repr=False)
    steps: dict[int, deque] = field(default_factory=dict, repr=False)
    _curve: tuple[tuple[int, float], ...] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, target) -> LoadCosts:
        """Costs whose t(B, n) are the target's ``batch_pass_costs``: what earlier batched runs on this target measured
        (a target's passes cost what they cost whichever drafter feeds them), so a run does not relearn them, as the
        single-request policy measures its verify-cost curve once per target. Draft steps are the run's own."""
        passes = getattr(target, "batch_pass_costs", None)
        return cls() if passes is None else cls(passes=passes)

    def observe(self, batch: int, fed: int, seconds: float) -> None:
        """A pass over ``batch`` requests of ``fed`` tokens each (the padded width) took ``seconds``."""
        if math.isfinite(seconds) and seconds > 0:
            self.passes.setdefault((batch, fed), deque(maxlen=self.window)).append(seconds)
            self._curve = None

    def observe_draft(self, batch: int, steps: int, seconds: float) -> None:
        """Proposing ``steps`` draft steps for ``batch`` requests took ``seconds``."""
        if steps > 0 and math.isfinite(seconds) and seconds >= 0:
            self.steps.setdefault(batch, deque(maxlen=self.window)).append(seconds / steps)

    def known(self, batch: int, fed: int) -> bool:
        return (batch, fed) in self.passes

    def seconds(self, batch: int, fed: int) -> float | None:
        """t(batch, fed): measured, or predicted from the curve over tokens fed (None while it has < 2 points)."""
        if (batch, fed) in self.passes:
            return statistics.median(self.passes[batch, fed])
        curve = self.curve()
        if len(curve) < 2:
            return None
        return _along(curve, batch * fed) * self._scale(batch, curve)

    def draft_step(self, batch: int) -> float:
        """Seconds of one draft step for ``batch`` requests: measured, else the nearest measured batch's scaled by
        the batch size (a drafter that loops over requests), else 0 (not measured yet)."""
        if batch in self.steps:
            return statistics.median(self.steps[batch])
        if not self.steps:
            return 0.0
        nearest = min(self.steps, key=lambda b: (abs(b - batch), b))
        return statistics.median(self.steps[nearest]) * batch / nearest

    def curve(self) -> tuple[tuple[int, float], ...]:
        """(tokens fed B n, median seconds over the (B, n) measured at it), sorted by B n."""
        if self._curve is None:
            by_tokens: dict[int, list[float]] = {}
            for (batch, fed), seconds in self.passes.items():
                by_tokens.setdefault(batch * fed, []).append(statistics.median(seconds))
            self._curve = tuple((t, statistics.median(v)) for t, v in sorted(by_tokens.items()))
        return self._curve

    def _scale(self, batch: int, curve: tuple[tuple[int, float], ...]) -> float:
        """What this batch size measured over what the curve says for it (1 when it measured nothing)."""
        ratios = [statistics.median(s) / _along(curve, b * n) for (b, n), s in self.passes.items() if b == batch]
        return statistics.median(ratios) if ratios else 1.0


def _along(points: tuple[tuple[int, float], ...], x: float) -> float:
    """Linear through the points (at least two); the first point's value before it (a pass of fewer tokens costs
    no more), the last segment's slope past the last, at least the last point's value (nor does one of more cost
    less)."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return max(y1 + (y1 - y0) * (x - x1) / (x1 - x0), y1)


def goodput(acceptance: Sequence[Sequence[float]], gamma: int, seconds: float) -> float:
    """Expected committed tokens per second of a pass drafting ``gamma`` for requests with these per-depth
    acceptances, that costs ``seconds``."""
    return sum(expected_tokens_by_depth(a, gamma) for a in acceptance) / seconds


@dataclass
class BatchPolicy:
    """The draft length of each steady batched pass (every live request past its prefill), by batch size."""

    min_gain: float = 1.02  # drafting must beat a plain pass's goodput by this factor (a noise margin)
    explore: int = 1  # the draft length of the first drafted pass at a load (nothing predicts its cost yet)
    probe_every: int = 16
    max_backoff: int = 3  # probes at a load that keeps losing: every probe_every * 2**k passes, k <= max_backoff
    refresh_every: int = 32
    costs: LoadCosts = field(default_factory=LoadCosts)
    idle: dict[int, int] = field(default_factory=dict)  # B -> plain passes in a row since drafting last paid
    losing: dict[int, int] = field(default_factory=dict)  # B -> probes in a row after which drafting did not pay
    unrefreshed: dict[int, int] = field(default_factory=dict)  # B -> drafted passes since its last plain one
    choices: dict[int, list[int]] = field(default_factory=dict)  # B -> gamma of every pass planned at B

    def gamma(self, acceptance: Sequence[Sequence[float]], width: float) -> int:
        """Gamma for a pass of ``len(acceptance)`` requests: ``acceptance[i]`` is request i's per-depth acceptance
        (as many depths as it may draft), ``width`` draft tokens per depth."""
        batch = len(acceptance)
        gamma = self._plan(batch, acceptance, width)
        self.choices.setdefault(batch, []).append(gamma)
        return gamma

    def _plan(self, batch: int, acceptance: Sequence[Sequence[float]], width: float) -> int:
        depths = min(len(a) for a in acceptance)
        if depths == 0 or not self.costs.known(batch, 1) or self.unrefreshed.get(batch, 0) >= self.refresh_every:
            return 0
        plain = goodput(acceptance, 0, self.costs.seconds(batch, 1))
        best, best_goodput = 0, plain
        for g in range(1, depths + 1):
            seconds = self.costs.seconds(batch, fed_tokens(g, width))
            if seconds is None:
                return min(self.explore, depths)  # a drafted pass cannot be predicted yet: measure one
            rate = goodput(acceptance, g, g * self.costs.draft_step(batch) + seconds)
            if rate > best_goodput:
                best, best_goodput = g, rate
        if best and best_goodput > self.min_gain * plain:
            self.idle[batch] = self.losing[batch] = 0
            return best
        self.idle[batch] = self.idle.get(batch, 0) + 1
        losing = self.losing.get(batch, 0)
        if self.idle[batch] < self.probe_every * 2 ** min(losing, self.max_backoff):
            return 0
        self.idle[batch], self.losing[batch] = 0, losing + 1
        return best or 1  # a probe: the estimates at this load stay current

    def timed(self, batch: int, fed: int, steps: int, draft_seconds: float, seconds: float) -> None:
        """A steady pass over ``batch`` requests of ``fed`` tokens each (padded), after ``steps`` draft steps that
        took ``draft_seconds``, took ``seconds`` (forward, verification, commit)."""
        self.costs.observe(batch, fed, seconds)
        self.costs.observe_draft(batch, steps, draft_seconds)
        self.unrefreshed[batch] = self.unrefreshed.get(batch, 0) + 1 if fed > 1 else 0

    def describe(self) -> str:
        """Per batch size: the passes planned and the share that drafted, with the latest gamma."""
        parts = []
        for batch, gammas in sorted(self.choices.items()):
            drafted = sum(g > 0 for g in gammas) / len(gammas)
            parts.append(f"B={batch}: {len(gammas)} passes, {drafted:.0%} drafted, last gamma {gammas[-1]}")
        return "draft length by load: " + ("; ".join(parts) if parts else "no steady batched pass")


def proposing(acceptance: list[float], rate: float) -> list[float]:
    """Per-depth acceptance of a drafter that proposes anything in only a ``rate`` share of the passes it is asked
    to (an n-gram drafter without a match proposes nothing): its expected gain is ``rate`` times the gain of a
    proposal, so depth 1's acceptance is scaled by it."""
    return [acceptance[0] * rate, *acceptance[1:]] if acceptance else []


def fed_tokens(gamma: int, width: float) -> int:
    """Tokens a request feeds in a pass drafting ``gamma`` levels of ``width`` tokens each, the root included."""
    return 1 + math.ceil(gamma * width - 1e-9)
