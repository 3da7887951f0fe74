"""The target's verification cost curve: t(g + 1) / t(1), one pass over the root plus g draft tokens.

The paper assumes it is 1; on a CPU it is not, so runs, calibrations and searches measure it with the
very Target calls the decode loop makes and predict speedups with it.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specfamily.core.target import Target
from specfamily.core.types import Draft

log = logging.getLogger(__name__)
CURVE_SIZES = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)  # draft tokens g timed for the cost-aware policy
CURVE_CONTEXT = 256  # tokens in the cache while timing: about a Spec-Bench prompt plus half an answer


def device_clock(device: torch.device | str) -> Callable[[], float]:
    """Wall time for work on ``device``: ``time.perf_counter`` itself, after a ``torch.cuda.synchronize`` on a CUDA
    device (its kernels run asynchronously: without the sync a timed region ends when its work is queued, not done)."""
    device = torch.device(device)
    if device.type != "cuda":
        return time.perf_counter

    def synchronised() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return synchronised


def process_clock(device: torch.device) -> Callable[[], float]:
    """A timer for one process's work: CPU time on a single-threaded CPU run (immune to busy neighbours),
    otherwise the device's wall clock (:func:`device_clock`)."""
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return device_clock(device)


def measure_verify_cost(
    target: Target, context: Sequence[int], sizes: Sequence[int], repeats: int = 5, clock=time.perf_counter,
    features: bool = False,
) -> dict[int, float]:
    """Median time of a pass over 1 + g tokens divided by the median one-token pass, for each g in ``sizes``."""
    seconds = measure_pass_seconds(target, context, sizes, repeats, clock, features)
    return {g: seconds[g] / seconds[0] for g in seconds}


def measure_pass_seconds(
    target: Target, context: Sequence[int], sizes: Sequence[int], repeats: int = 5, clock=time.perf_counter,
    features: bool = False,
) -> dict[int, float]:
    """Median seconds of one target pass over the root plus g draft tokens, for g = 0 and each g in ``sizes``.

    The context is prefilled once; passes of every size are interleaved round by round so that
    slow drift (other load, the growing cache) spreads evenly over the sizes. ``features``: passes also
    return the last hidden states, as they do for drafters that need them.
    """
    sizes = sorted({0, *(int(g) for g in sizes)})
    if any(g < 0 for g in sizes):
        raise ValueError(f"verify cost sizes must be >= 0, got {sizes}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    ids = target.check_ids(list(context))
    limit = max_positions(target)
    if limit is not None and len(ids) + (repeats + 1) * len(sizes) + max(sizes) + 1 > limit:
        raise ValueError(f"a {len(ids)}-token context leaves no room to time passes of up to {max(sizes) + 1} tokens")
    target.reset()
    target.forward(ids[:-1] if len(ids) > 1 else ids)
    target.commit([])
    root = ids[-1:].to(target.device)
    gen = torch.Generator().manual_seed(0)
    drafts = {g: Draft.chain(torch.randint(0, target.vocab_size, (g,), generator=gen)) for g in sizes}
    times: dict[int, list[float]] = {g: [] for g in sizes}
    for round_ in range(repeats + 1):  # round 0 warms every shape up
        for g in sizes:
            start = clock()
            target.forward(root, drafts[g], features=features)
            target.commit([])
            if round_:
                times[g].append(clock() - start)
    target.reset()
    return {g: statistics.median(times[g]) for g in sizes}


def timing_context(target: Target, ids: Sequence[int], length: int, sizes: Sequence[int], repeats: int) -> list[int]:
    """``length`` tokens to time passes over: the last ones of ``ids``, or ``ids`` repeated when there are fewer.

    A pass's time depends on how many tokens are cached, not on which: attention over the cache grows with its
    length times the tokens fed, so a curve timed over a short prompt understates what a verify pass costs later in
    a request (measured: docs/results.md, "Figures that used to live in the source"). Shortened to leave room for
    the timed passes within the model's position limit."""
    ids = list(ids)
    limit = max_positions(target)
    if limit is not None:
        sizes = {0, *sizes}
        length = min(length, limit - (repeats + 1) * len(sizes) - max(sizes) - 1)
    if not ids or length <= len(ids):
        return ids[-max(length, 1) :]
    return (ids * -(-length // len(ids)))[-length:]


def max_positions(target: Target) -> int | None:
    config = target.model.config.get_text_config(decoder=True)
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def monotone_curve(curve: dict[int, float]) -> dict[int, float]:
    """The least-squares fit of ``curve`` (t(g + 1) / t(1) by g) that never falls as g grows (isotonic regression). A
    pass over more tokens does no less work, but medians of a few timed passes are noisy: one measurement here read 1.28
    at g = 1 and 1.10 at g = 2 (docs/batching.md, session 42), which told a policy that two draft tokens cost less
    than one; pooled with 1.13 at g = 3, all three read 1.17. g = 0 keeps its 1, and no g > 0 is fitted below it
    (clipping an isotonic fit at a bound is the bounded fit)."""
    from scipy.optimize import isotonic_regression

    sizes = sorted(g for g in curve if g > 0)
    floor = float(curve.get(0, 1.0))  # t(1) / t(1): 1 by definition, never refitted
    if not sizes:
        return dict(curve)
    fitted = isotonic_regression([float(curve[g]) for g in sizes], increasing=True).x
    kept = {0: floor} if 0 in curve else {}
    return {**kept, **{g: max(float(v), floor) for g, v in zip(sizes, fitted, strict=True)}}


@dataclass(frozen=True)
class CostCurve:
    """t(g + 1) / t(1) as a callable of g, the measured points sorted once (a policy asks every pass)."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, curve: dict) -> CostCurve:
        return cls(tuple(sorted((int(g), float(cost)) for g, cost in curve.items())))

    def __call__(self, g: float) -> float:
        return _interpolate(self.points, g)


def verify_cost_at(curve: dict[int, float], g: float) -> float:
    """t(g + 1) / t(1) at any g >= 0, linear between the measured sizes, extended linearly past the last."""
    return CostCurve.of(curve)(g)


def _interpolate(points: tuple[tuple[int, float], ...], g: float) -> float:
    if not points:
        return 1.0
    if g <= points[0][0]:
        return points[0][1]
    for (g0, v0), (g1, v1) in zip(points, points[1:], strict=False):
        if g <= g1:
            return v0 + (v1 - v0) * (g - g0) / (g1 - g0)
    if len(points) == 1:
        return points[0][1]
    (g0, v0), (g1, v1) = points[-2], points[-1]
    return max(v1 + (v1 - v0) * (g - g1) / (g1 - g0), v1)


def target_cost_curve(target: Target, context: Sequence[int], repeats: int = 3) -> Callable[[float], float]:
    """This target's t(g + 1) / t(1) as a function of g, measured on this machine once per Target (the first
    time a cost-aware policy needs it, over ``CURVE_CONTEXT`` tokens of ``context``: ``timing_context``) and kept in
    ``target.verify_costs``, which a run may also fill with its own measurement. A context too long for the model
    to time leaves the paper's assumption, 1. The measured ratios are kept fitted non-decreasing in g
    (:func:`monotone_curve`)."""
    if target.verify_costs is None:
        try:
            clock = process_clock(target.device)
            ids = timing_context(target, context, CURVE_CONTEXT, CURVE_SIZES, repeats)
            target.verify_costs = monotone_curve(measure_verify_cost(target, ids, CURVE_SIZES, repeats, clock))
        except ValueError as err:
            log.warning("verify cost not measured (%s); assuming t(g + 1) = t(1)", err)
            target.verify_costs = {0: 1.0}
    return CostCurve.of(target.verify_costs)


@dataclass
class MeasuredCost:
    """What the passes a run really makes cost: ``plain_seconds``, its plain pass, and ``scale(g)``, its drafted
    passes' seconds over what a prior verify-cost curve predicts for them (the prior's t(g + 1) / t(1) times the
    plain pass), per draft-token count g. A policy plans with prior(g) * scale(g).

    Fed by :meth:`observe` with each timed pass (the loop's verify seconds: target forward, masks, tree rewrite,
    sampling warp and verification, commit, at the cache length the run has reached). Every estimate is a median of
    its last ``window`` observations, so one preempted pass does not steer a run, and the plain pass follows the run's
    latest plain passes (the cache grows). ``scale`` is linear between the token counts measured and constant past
    them; 1 until a plain pass is timed (drafted passes timed before it are compared with it when it comes).
    """

    window: int = 5
    plain: deque = field(init=False, repr=False)  # seconds of the latest plain passes
    ratios: dict[int, deque] = field(init=False, repr=False)  # per token count: seconds / (plain seconds * prior)
    points: tuple[tuple[int, float], ...] = field(init=False, default=())  # (token count, median ratio), sorted
    early: list[tuple[int, float, float]] = field(init=False, default_factory=list, repr=False)  # before a plain one
    unrefreshed: int = field(init=False, default=0)  # drafted passes timed since the last plain one

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an integer >= 1, got {self.window!r}")
        self.plain, self.ratios = deque(maxlen=self.window), {}

    @property
    def plain_seconds(self) -> float | None:
        """t(1) in seconds as the run measures it now (None before its first plain pass)."""
        return statistics.median(self.plain) if self.plain else None

    def scale(self, g: float) -> float:
        """Measured seconds of a pass over g draft tokens over what the prior and ``plain_seconds`` predict."""
        points = self.points
        if not points:
            return 1.0
        if g <= points[0][0]:
            return points[0][1]
        if g >= points[-1][0]:
            return points[-1][1]
        return _interpolate(points, g)

    def observe(self, tokens: int, seconds: float, prior: float, fresh: bool = False) -> bool:
        """One timed pass over the root plus ``tokens`` draft tokens, which the prior costs ``prior`` plain passes;
        whether an estimate changed (a drafted pass before any plain one is kept until a plain one comes; a
        non-finite or non-positive time or prior is ignored). ``fresh``: the pass replaces what was measured at its
        token count rather than joining it (a probe's: a window of slow passes that made a policy idle is never
        outvoted otherwise, for an idle policy drafts one pass an interval)."""
        if not (math.isfinite(seconds) and seconds > 0 and math.isfinite(prior) and prior > 0):
            return False
        self.unrefreshed = self.unrefreshed + 1 if tokens else 0
        if tokens == 0:
            self.plain.append(seconds)
            early, self.early = self.early, []
            for passed in early:
                self._add(*passed)
            return True
        if self.plain_seconds is None:
            self.early = [*self.early, (tokens, seconds, prior)][-self.window :]
            return False
        if fresh:
            self.ratios.pop(tokens, None)
        self._add(tokens, seconds, prior)
        return True

    def _add(self, tokens: int, seconds: float, prior: float) -> None:
        self.ratios.setdefault(tokens, deque(maxlen=self.window)).append(seconds / (self.plain_seconds * prior))
        self.points = tuple((g, statistics.median(r)) for g, r in sorted(self.ratios.items()))

    def refresh_due(self, every: int) -> bool:
        """Whether to make a plain pass to measure t(1) again: drafted passes were timed and none of the last
        ``every`` passes timed was plain (right away while no plain pass has been timed)."""
        return self.unrefreshed >= (1 if self.plain_seconds is None else every)

    def describe(self, g: float, prior: Callable[[float], float]) -> str:
        """The corrected verify cost at g draft tokens, and what it is made of."""
        cost = f"verify cost {prior(g) * self.scale(g):.2f} plain passes at {g:.1f} draft tokens"
        if self.plain_seconds is None:
            return f"{cost} (the curve; no pass timed yet)"
        plain = self.plain_seconds * 1e3
        return f"{cost} (curve {prior(g):.2f} x measured {self.scale(g):.2f}; plain pass {plain:.2f} ms)"
