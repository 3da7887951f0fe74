"""What a batched pass costs, learned from the run's own passes: t(B, N) over the slots' cached contexts.

A batched pass over B requests feeding N rows in all costs t(B, N) plus what its rows' attention reads and computes
over their slots' caches, and that grows with the contexts: each slot's root row reads its slot's cached keys and
values (a cost per slot per cached token), and each draft row attends the same cache again (a smaller one per draft
row per cached token; docs/batching-log.md measures how a draft row's cost grows with its slot's context).
:class:`RowCosts` prices a pass as

    t(B, N, contexts) = t0(B, N) + k_slot * sum of the slots' cached lengths + k_row * sum over draft rows of theirs,

t0 the context-free cost: medians of the latest few passes per (B, N) less their context terms (elsewhere a curve over N
through the measured points, scaled by what this B measured against it; a run's table leaves each shape's first pass
out, which pays the shape's one-time set-up), and the two slopes fitted on the run's passes within each (B, N), refitted
as the caches grow (a pass of the same shape at another context is the measurement: plain passes at several contexts
give k_slot, drafted ones then k_row). The seconds of one batched draft step per B are kept beside them, and the host
seconds a steady pass spends outside its forward (its plan, its proposals, its drafts' commit), drafted and undrafted
passes apart: the table prices a pass at what it costs whole, an undrafted pass's host seconds beside t(B, B) and a
drafted pass's beside every t(B, N > B). A drafted pass plans on its proposals, cuts and verifies them and records them,
host work that grows no cheaper with the forward's threads (docs/batching-log.md, session 29). A plan made once its
drafts are proposed (lookahead: prompt lookup, suffix) has spent its seconds before the forward whichever way it goes,
and prices only what is still to spend (``table(..., proposed=True)``: each pass's seconds after its forward are kept
beside its host seconds; docs/batching-log.md, session 30).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass, field

__all__ = ["RowCosts", "context_slopes"]


@dataclass
class RowCosts:
    """Seconds of a batched pass over B requests feeding N rows in all at the slots' contexts, t(B, N, contexts),
    and of one draft step for B requests: context-free medians of the latest ``window`` observations per (B, N),
    context slopes over the latest ``history`` of each, refitted every ``refit_every`` passes."""

    window: int = 5
    history: int = 32
    refit_every: int = 16
    ridge: float = 32768.0  # tokens^2: the slopes' prior of no context term, worth 8 passes 64 tokens apart
    cold: bool = False  # leave each shape's first pass out (``of``: a run's costs)
    passes: dict[tuple[int, int], deque] = field(default_factory=dict, repr=False)  # (B, N) -> (s, slots, drafted)
    steps: dict[int, deque] = field(default_factory=dict, repr=False)
    host: dict[tuple[int, bool], deque] = field(default_factory=dict, repr=False)  # (B, drafted) -> host seconds
    host_after: dict[tuple[int, bool], deque] = field(default_factory=dict, repr=False)  # of them, after the forward
    slopes: tuple[float, float] = (0.0, 0.0)  # seconds per cached token: of a slot, of a draft row
    _since: int = field(default=0, repr=False)
    _medians: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)
    _by_batch: dict[int, dict[int, float]] = field(default_factory=dict, repr=False)  # B -> {N: median}
    _host_means: dict[int, tuple[float, ...]] = field(default_factory=dict, repr=False)  # host_seconds'
    _curve: tuple[list[int], list[float]] | None = field(default=None, repr=False)
    _bases: dict[tuple[int, int], list[float]] = field(default_factory=dict, repr=False)  # table's before its terms
    _widest: dict[int, int] = field(default_factory=dict, repr=False)  # B -> the most rows a pass of it fed

    def __post_init__(self) -> None:
        for key, kept in self.passes.items():
            self.passes[key] = deque(kept, maxlen=self.history)
            self._widen(*key)
        self.refit()

    @classmethod
    def of(cls, target, drafter=None) -> RowCosts:
        """Costs over the target's ``batch_pass_costs`` (kept across runs: passes cost what they cost whichever
        drafter feeds them) and ``batch_draft_steps`` of ``drafter``'s class (kept across runs per class: a run's
        first drafted pass would otherwise be priced at a step of 0; docs/batching-log.md, session 29); either the
        run's own where the target has no such record. Each shape's first pass is left out (``cold``): it pays the
        shape's one-time set-up, and a run's few passes of a shape kept it as their price (docs/batching-log.md,
        session 38)."""
        passes = getattr(target, "batch_pass_costs", None)
        costs = cls(passes={} if passes is None else passes, cold=True)
        steps = getattr(target, "batch_draft_steps", None)
        if steps is not None and drafter is not None:
            costs.steps = steps.setdefault(type(drafter).__qualname__, {})
        return costs

    def observe(self, batch: int, rows: int, seconds: float, slots: float = 0.0, drafted: float = 0.0,
                host: float | None = None, after: float = 0.0) -> None:
        """A pass of ``batch`` slots feeding ``rows`` rows took ``seconds``; its slots held ``slots`` cached tokens in
        all and its draft rows attended ``drafted`` (each draft row its slot's cached length); ``host``: its seconds
        outside the forward, if measured, ``after`` of them after it (:meth:`observe_host`)."""
        if host is not None:
            self.observe_host(batch, rows > batch, host, after)
        if not (math.isfinite(seconds) and seconds > 0):
            return
        kept = self.passes.get((batch, rows))
        if kept is None:  # not setdefault: a deque built on every pass for nothing
            kept = self.passes[batch, rows] = deque(maxlen=self.history)
            self._widen(batch, rows)
            if self.cold:  # its first pass: kept empty, the shape seen (a kept table does not leave it out again)
                return
        kept.append((seconds, float(slots), float(drafted)))
        self._since += 1
        if self._since >= self.refit_every:
            self.refit()
        else:
            self._note(batch, rows)

    def refit(self) -> None:
        """The slopes over every kept pass (:func:`context_slopes`), then every (B, N)'s context-free median."""
        self._since = 0
        self.slopes = context_slopes(list(self.passes.values()), self.ridge)
        for (batch, rows), kept in self.passes.items():
            if kept:  # a cold shape's first pass left none
                self._note(batch, rows)

    def _note(self, batch: int, rows: int) -> None:
        """(B, N)'s context-free median over its latest ``window`` passes; the curve and the tables built on the
        medians are built again only once one moved."""
        k_slot, k_row = self.slopes
        kept = self.passes[batch, rows]
        latest = list(kept)[-self.window :] if len(kept) > self.window else kept
        median = _median([s - k_slot * c - k_row * d for s, c, d in latest])
        if self._medians.get((batch, rows)) != median:
            self._medians[batch, rows] = median
            own = self._by_batch.get(batch)
            if own is None:
                own = self._by_batch[batch] = {}
            own[rows] = median
            self._curve = None
            self._bases.clear()

    def observe_draft(self, batch: int, steps: int, seconds: float) -> None:
        if steps > 0 and math.isfinite(seconds) and seconds >= 0:
            kept = self.steps.get(batch)
            if kept is None:
                kept = self.steps[batch] = deque(maxlen=self.window)
            kept.append(seconds / steps)

    def observe_host(self, batch: int, drafted: bool, seconds: float, after: float = 0.0) -> None:
        """A steady pass of ``batch`` requests (``drafted``: it fed draft rows) spent ``seconds`` outside its
        forward, ``after`` of them after it (its commits and records: what a plan made after the proposals has still
        to spend, :meth:`host_seconds`)."""
        if math.isfinite(seconds) and seconds >= 0:
            after = after if math.isfinite(after) and 0 <= after <= seconds else 0.0
            kept = self.host.get((batch, drafted))
            if kept is None:
                kept = self.host[batch, drafted] = deque(maxlen=self.history)
                self.host_after[batch, drafted] = deque(maxlen=self.history)
            kept.append(seconds)
            self.host_after[batch, drafted].append(after)
            self._host_means.pop(batch, None)

    def host_seconds(self, batch: int, proposed: bool = False) -> tuple[float, float]:
        """(an undrafted pass's, a drafted pass's) mean host seconds at ``batch``: the mean, as a run's seconds are a
        sum of passes; a kind not measured yet is priced as the other, neither as 0. ``proposed``: for a plan made
        after the drafts were proposed (lookahead), whose seconds before the forward (the plan before them, the
        proposals, the plan on them) are spent whichever way it goes: a drafted pass then costs an undrafted pass's
        host seconds with its seconds after the forward a drafted pass's. Kept until ``batch`` observes another pass
        (every :meth:`table` of a pass asks it)."""
        if batch not in self._host_means:
            self._host_means[batch] = self._host_mean(batch)
        plain, drafted, plain_after, drafted_after = self._host_means[batch]
        return (plain, plain - plain_after + drafted_after) if proposed else (plain, drafted)

    def _host_mean(self, batch: int) -> tuple[float, float, float, float]:
        """(undrafted, drafted, undrafted after the forward, drafted after the forward) means at ``batch``, a kind
        not measured yet as the other, neither as 0."""
        plain, fed = (self._means((batch, d)) for d in (False, True))
        plain = fed if plain is None else plain
        fed = plain if fed is None else fed
        return (0.0, 0.0, 0.0, 0.0) if plain is None else (plain[0], fed[0], plain[1], fed[1])

    def _means(self, key: tuple[int, bool]) -> tuple[float, float] | None:
        """The kept host seconds' mean and their after-forward seconds' at ``key`` (statistics.fmean's numbers), or
        None without any."""
        kept = self.host.get(key)
        if not kept:
            return None
        return math.fsum(kept) / len(kept), math.fsum(self.host_after[key]) / len(kept)

    def known(self, batch: int, rows: int) -> bool:
        return (batch, rows) in self._medians

    def measured(self, batch: int, rows: int, slots: float = 0.0, drafted: float = 0.0) -> float | None:
        """t(batch, rows) as measured at these contexts (the context-free median plus the context terms), or None."""
        base = self._medians.get((batch, rows))
        return None if base is None else base + self.slopes[0] * slots + self.slopes[1] * drafted

    def row_token(self) -> float:
        """Seconds a draft row costs per cached token of its slot."""
        return self.slopes[1]

    def draft_step(self, batch: int) -> float:
        """Seconds of one draft step for ``batch`` requests: measured, else the nearest measured batch's scaled by
        the batch size, else 0."""
        if batch in self.steps:
            return statistics.median(self.steps[batch])
        if not self.steps:
            return 0.0
        nearest = min(self.steps, key=lambda b: (abs(b - batch), b))
        return statistics.median(self.steps[nearest]) * batch / nearest

    def table(self, batch: int, most: int, slots: float = 0.0, proposed: bool = False) -> list[float] | None:
        """t(batch, N) for N = 0 .. min(most, :meth:`reach`) (measured, else predicted) with the slots holding
        ``slots`` cached tokens in all, draft rows' context terms left out (``row_token``), each with its pass's host
        seconds (:meth:`host_seconds`, ``proposed`` or not: a drafted pass's from N > batch on), or None while the
        curve has < 2 points.
        Predicted: the curve over N scaled by what this B measured against it. The plan cannot feed more rows than
        the table holds."""
        top = min(most, self.reach(batch))
        table = self._base(batch, top)
        if table is None:
            return None
        plain, drafted = self.host_seconds(batch, proposed)
        return [t + self.slopes[0] * slots + (drafted if n > batch else plain) for n, t in enumerate(table)]

    def _base(self, batch: int, top: int) -> list[float] | None:
        """:meth:`table`'s context-free forwards for N = 0 .. ``top``, kept until a median moves (the plan asks
        the same table several times a pass)."""
        table = self._bases.get((batch, top))
        if table is not None:
            return table
        xs, ys = self.curve()
        if len(xs) < 2:
            return None
        own = self._by_batch.get(batch, {})
        scale = _median([s / _at(xs, ys, n) for n, s in own.items()]) if own else 1.0
        table = [_at(xs, ys, n) * scale for n in range(top + 1)]
        for n, s in own.items():
            if n <= top:
                table[n] = s
        self._bases[batch, top] = table
        return table

    def reach(self, batch: int) -> int:
        """The most rows a pass of ``batch`` requests may be priced at: the widest pass it fed plus one draft row
        a slot. Past the passes a batch size has measured its cost is a guess: the curve of other batch sizes,
        extended by its last segment's slope, which a flat or noisy last segment makes far too cheap for a product
        of 64-136 rows (suffix's trees feed up to 16 rows a slot; such products are compute-bound:
        docs/batching-log.md, session 26). Each drafted pass at the reach measures the next shape, so the reach grows
        by what the plan chose to feed (a cold first pass included)."""
        return self._widest.get(batch, batch) + batch

    def _widen(self, batch: int, rows: int) -> None:
        if rows > self._widest.get(batch, 0):
            self._widest[batch] = rows

    def curve(self) -> tuple[list[int], list[float]]:
        """Rows N and the median context-free seconds over the batch sizes measured at N, sorted by N."""
        if self._curve is None:
            by_rows: dict[int, list[float]] = {}
            for (_, rows), seconds in self._medians.items():
                by_rows.setdefault(rows, []).append(seconds)
            ordered = sorted(by_rows.items())
            self._curve = ([n for n, _ in ordered], [statistics.median(v) for _, v in ordered])
        return self._curve


def context_slopes(groups: list, ridge: float = 0.0) -> tuple[float, float]:
    """(k_slot, k_row) from groups of passes of one shape each, (seconds, slots, drafted): least squares of seconds on
    the two context sums within each group (its own mean taken out: the shape's cost is its own), with ``ridge`` on
    both, neither below 0 (a slope that fits below 0 is refitted at 0 and the other alone)."""
    sxx = sxy = syy = sxs = sys_ = 0.0  # x: slots, y: drafted, s: seconds, after each group's means
    for group in groups:
        n = len(group)
        if n < 2:
            continue
        ms, mx, my = (math.fsum(column) / n for column in zip(*group, strict=True))  # statistics.fmean's numbers
        for s, x, y in group:
            s, x, y = s - ms, x - mx, y - my
            sxx, sxy, syy, sxs, sys_ = sxx + x * x, sxy + x * y, syy + y * y, sxs + x * s, sys_ + y * s
    a, d = sxx + ridge, syy + ridge
    det = a * d - sxy * sxy
    if det > 0:
        k_slot, k_row = (d * sxs - sxy * sys_) / det, (a * sys_ - sxy * sxs) / det
        if k_slot >= 0 and k_row >= 0:
            return k_slot, k_row
    k_slot = max(0.0, sxs / a) if a > 0 else 0.0
    k_row = max(0.0, sys_ / d) if d > 0 else 0.0
    if k_slot > 0 and k_row > 0:  # both fitted below 0 jointly: keep the one that explains more alone
        return (k_slot, 0.0) if k_slot * sxs >= k_row * sys_ else (0.0, k_row)
    return k_slot, k_row


def _at(xs: list[int], ys: list[float], x: float) -> float:
    """Linear through the points (at least two); the first point's value before it (a pass of fewer rows costs no
    more), the last segment's slope past the last, at least the last point's value (nor does one of more cost less)."""
    k = bisect.bisect_left(xs, x)
    if k == 0:
        return ys[0]
    if k == len(xs):
        x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]
        return max(y1 + (y1 - y0) * (x - x1) / (x1 - x0), y1)
    x0, x1, y0, y1 = xs[k - 1], xs[k], ys[k - 1], ys[k]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _median(values: list[float]) -> float:
    """statistics.median's number, without its generic checks (every pass asks it)."""
    values.sort()
    half = len(values) // 2
    return values[half] if len(values) % 2 else (values[half - 1] + values[half]) / 2
