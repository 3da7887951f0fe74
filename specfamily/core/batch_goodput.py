"""What drafted batched passes realized against what their plans predicted, kept across runs; the batch's-end plan.

:class:`Realized` holds one batch size's drafted passes (predicted gain, realized gain); its correction
(realized / predicted, at most 1) scales later plans at that load, so a load whose drafts keep under-delivering stops
drafting but for probes. The correction starts from a doubtful prior (``doubt``, worth ``weight`` passes): a plan
must clear the drafting margin by more until passes have borne such plans out, and every pass moves it towards what
was realized. :func:`kept_realized` keeps the windows on the target per drafter class and batch size (beside the
pass costs, ``Target.batch_pass_costs``), so a sweep's or a server's later runs start from what earlier ones
realized; :func:`correction` borrows the nearest batch size's passes where a load has few of its own.

:func:`plan_together`: at the batch's end (no request waits for a slot) the batch's remaining passes are those of its
longest requests, and k requests tied at the most tokens left all have to advance for a pass to end the batch sooner.
A pass advances the batch by 1 + min over the tied requests of their accepted tokens, whose expectation is the sum
over depths d of the probability that every tied request accepts d deep (independent requests: the product of their
reaches). So the tied requests draft to one depth together, or none of them drafts. A slot whose end is b passes
before the batch's joins from depth b + 1, drafting k - b levels where the tied ones draft k: without it, a tied
slot's levels past b would end the batch no sooner (that slot would end it instead); the rest draft nothing.
That picture is one pass's: it holds a couple of passes from the end. Further from it, which slot ends last is not
settled yet (each slot's end moves by what it happens to accept on every pass until then), so tied slots that all
draft end the batch about tau times sooner although a single pass advances it only by their least acceptance:
:func:`end_odds` gives each slot's chance of ending the batch, and a token of a slot is worth that chance of a token
of the batch's end (the plan then sums them, ``batch_lengths.finishing``).
"""

from __future__ import annotations

import itertools
import math
import operator
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import integrate, special

__all__ = ["Realized", "backoff", "behind_ends", "correction", "end_odds", "finishing", "kept_realized", "last_wave",
           "near_end", "plan_together", "projected_ends", "ratio_error", "realized_gain", "wave_of"]


def realized_gain(tokens: float, seconds: float, plain_tokens: float, plain_seconds: float) -> float:
    """A pass's goodput over a plain pass's: ``tokens`` valued tokens committed in ``seconds`` (draft, forward,
    verification, commit) against ``plain_tokens`` (every valued request's one token) in t(B, B)."""
    if seconds <= 0 or plain_tokens <= 0 or plain_seconds <= 0:
        return 1.0
    return (tokens / seconds) / (plain_tokens / plain_seconds)


@dataclass
class Realized:
    """One batch size's drafted passes: (predicted gain, realized gain) of the latest ``window``. Their ratio (sum
    realized / sum predicted over n passes) is weighed against a doubtful prior worth ``weight`` passes,
    (n ratio + weight doubt) / (n + weight), at most 1: a plan needs evidence to be trusted (a marginal one is held
    back until passes bore such plans out), and the correction never pushes a plan the estimates do not predict.
    From ``least`` passes on, a ratio below that counts in full (the prior never excuses passes that lost; before,
    one unlucky pass does not stop a load).
    Sums over a window rather than a fast average: a pass's realized gain swings with what it happened to accept (a
    lucky pass accepts its whole draft), so one or two lucky or unlucky passes move the ratio by only their share of
    the window; a load that stopped drafting starts again once the probes that paid have lifted the ratio enough for
    its plans to clear the policy's margin."""

    window: int = 32
    doubt: float = 0.95
    weight: float = 2.0
    least: int = 3
    losing: int = 0  # the load's probes in a row that did not pay (its policy's back-off, kept with the window)
    waves_closed: int = 0  # runs its last waves still plan jointly only (``batch_waves.judge``; keyed by slots)
    passes: deque = field(default_factory=deque)
    plain: deque = field(default_factory=deque)  # (priced, measured) seconds of the load's latest undrafted passes

    def __post_init__(self) -> None:
        self.passes = deque(self.passes, maxlen=self.window)
        self.plain = deque(self.plain, maxlen=self.window)

    def add(self, predicted: float, realized: float) -> None:
        if math.isfinite(predicted) and math.isfinite(realized) and predicted > 0:
            self.passes.append((predicted, realized))

    def add_plain(self, priced: float, measured: float) -> None:
        """An undrafted pass measured ``measured`` seconds (from its plan on) where the cost table priced ``priced``
        (t(B, B) at its contexts, before it was observed)."""
        if math.isfinite(priced) and math.isfinite(measured) and priced > 0 and measured > 0:
            self.plain.append((priced, measured))

    def baseline(self) -> float:
        """What an undrafted pass realizes against its price, sum priced / sum measured over the latest ones (1
        without any): a drafted pass's realized gain is a single pass's seconds against the table's median of
        plain ones, so what every pass suffers alike (the plan's host work, the load's slow passes, which a mean
        of single passes counts and a median does not) reads as drafts under-delivering unless an undrafted pass,
        measured the same way, is the yardstick (docs/batching-log.md, session 28)."""
        priced, measured = sum(p for p, _ in self.plain), sum(m for _, m in self.plain)
        return priced / measured if measured > 0 else 1.0

    def correction(self, borrowed: Sequence[tuple[float, float]] = ()) -> float:
        """The correction over this window's passes and ``borrowed`` ones (a neighbouring load's): their ratio, shrunk
        towards the prior, and from ``least`` passes on lifted by its own standard error (:func:`ratio_error`): a
        window's ratio swings by that much with what its passes happened to accept, and a correction capped at 1 that
        took every low swing in full held back plans that were right on average (docs/batching-log.md, session 25)."""
        passes = [*self.passes, *borrowed]
        if not passes:
            return min(1.0, self.doubt)
        baseline = self.baseline()  # against an undrafted pass measured alike
        passes = [(p * baseline, r) for p, r in passes]
        ratio = sum(r for _, r in passes) / sum(p for p, _ in passes)
        shrunk = (len(passes) * ratio + self.weight * self.doubt) / (len(passes) + self.weight)
        if len(passes) < self.least:
            return min(1.0, shrunk)
        return min(1.0, min(shrunk, ratio) + ratio_error(passes, ratio))


def ratio_error(passes: Sequence[tuple[float, float]], ratio: float) -> float:
    """The standard error of ``ratio`` = sum realized / sum predicted over ``passes`` (the delta method: the spread of
    realized - ratio * predicted over the passes, over the mean prediction and the square root of their count)."""
    n = len(passes)
    if n < 2:
        return 0.0
    mean = sum(p for p, _ in passes) / n
    spread = sum((r - ratio * p) ** 2 for p, r in passes) / (n - 1)
    return math.sqrt(spread / n) / mean if mean > 0 else 0.0


def kept_realized(target, drafter) -> dict[int, Realized]:
    """The windows of ``drafter``'s class on ``target`` by batch size (kept across ``generate_batch`` calls on the
    target's ``batch_realized``; a target without it: a fresh dict, the run's own)."""
    kept = getattr(target, "batch_realized", None)
    if kept is None:
        return {}
    return kept.setdefault(type(drafter).__qualname__, {})


def correction(realized: dict[int, Realized], batch: int) -> float:
    """The correction at ``batch``: its own window's, with the nearest other batch size's passes borrowed while its
    own are fewer than a window (the nearest smaller on a tie); the prior alone where none was measured."""
    own = realized.get(batch, Realized())
    others = [b for b, w in realized.items() if b != batch and w.passes]
    if len(own.passes) >= own.window or not others:
        return own.correction()
    nearest = min(others, key=lambda b: (abs(b - batch), b))
    return own.correction(list(realized[nearest].passes)[-(own.window - len(own.passes)):])


def backoff(realized: dict[int, Realized], batch: int) -> int:
    """The probes in a row that did not pay at ``batch`` (where a run starts its back-off): its own record's, else the
    nearest batch size's that has drafted passes (the nearest smaller on a tie), else 0."""
    own = realized.get(batch)
    if own is not None and (own.passes or own.losing):
        return own.losing
    others = [b for b, w in realized.items() if b != batch and w.passes]
    return realized[min(others, key=lambda b: (abs(b - batch), b))].losing if others else 0


def plan_together(reaches: Sequence[Sequence[float]], rows: Sequence[Sequence[int]], seconds: Sequence[float],
                  step: float, batch: int, drafted: bool = False,
                  behind: Sequence[int] | None = None,
                  attended: tuple[Sequence[Sequence[float]], float] | None = None,
                  starts: Sequence[float] | None = None) -> tuple[int, float]:
    """(the depth k the slots projected to end last draft to, the plan's goodput over a plain pass's) for the
    slots' ``reaches`` (reach[d - 1]: the probability a request accepts d deep) and ``rows`` (rows[d - 1]: draft rows
    its level d adds) in a pass of ``batch`` requests. ``behind[i]``: the passes slot i's projected end is before the
    batch's (:func:`behind_ends`; default all 0: every slot tied at the end). To end the batch k passes sooner every
    slot less than k behind must accept k - behind[i] deep, so a slot drafts k - behind[i] levels (none from k <=
    behind[i]): the depth with the most expected batch advance, 1 + sum over k of the product of those reaches, per
    second of t(B, B + rows) + k step (``drafted``: the best that drafts), plus, with ``attended`` (each slot's
    per-level attended tokens, seconds a draft row costs per attended token), the draft rows' context costs, and
    with ``starts`` each slot's seconds before its first level (``batch_catchup``) once it drafts. Levels that end no
    slot sooner than another slot that stays put are never drafted."""
    behind = [0] * len(reaches) if behind is None else behind
    plain = 1.0 / seconds[batch]
    best, best_rate = 0, (0.0 if drafted else plain)
    advance, fed, context, started = 1.0, batch, 0.0, 0.0
    tokens, per_token = attended if attended is not None else (None, 0.0)
    deepest = min((b + len(r) for b, r in zip(behind, reaches, strict=True)), default=0)
    for depth in range(1, deepest + 1):
        levels = [(i, depth - b) for i, b in enumerate(behind) if b < depth]
        gain = math.prod(reaches[i][level - 1] for i, level in levels)
        fed += sum(rows[i][level - 1] for i, level in levels)
        context += sum(tokens[i][level - 1] for i, level in levels) if tokens is not None else 0.0
        started += sum(starts[i] for i, level in levels if level == 1) if starts is not None else 0.0
        if gain <= 0 or fed >= len(seconds):
            break
        advance += gain
        rate = advance / (seconds[fed] + per_token * context + depth * step + started)
        if rate > best_rate:
            best, best_rate = depth, rate
    return best, (best_rate / plain if best else 1.0)


def wave_of(waiting: int, slots: int, live: int, arrived: bool) -> int | None:
    """In a batch's last wave (every waiting request ``arrived``, at most one a slot: its remaining work is known and
    its end is set by the slots that end last), the live slots still to free one for a waiting request; else None.
    In a last wave the waiting requests are admitted together once a slot is free for each (the free slots are held
    for them), so they are prefilled in one pass as plain decoding's are: the batch's projected end is unchanged (the
    last of them cannot start before its slot frees, the others end no later), where admitting each as its slot
    frees feeds its prompt rows in a pass of its own (docs/batching-log.md, session 21)."""
    if waiting > slots or not arrived:
        return None
    return max(0, waiting - (slots - live))


def last_wave(remaining: Sequence[int], waiting: int, budget: int) -> list[float]:
    """Each live request's value to a batch in its last wave (every waiting request has arrived, at most one per slot:
    ``waiting`` <= the live requests): the batch ends when its last slot does, projected at one token a pass
    (:func:`projected_ends`). Value 1 for the slots projected to end last, 0 for the rest: alone, their tokens end
    the batch no sooner (:func:`behind_ends` says how far behind they are). With nothing waiting: the requests with
    the most tokens left."""
    return [1.0 if b == 0 else 0.0 for b in behind_ends(remaining, waiting, budget)]


def behind_ends(remaining: Sequence[int], waiting: int, budget: int) -> list[int]:
    """Passes each slot's projected end (:func:`projected_ends`) is before the batch's: 0 for the slots that end it."""
    if not remaining:
        return []
    ends = projected_ends(remaining, waiting, budget)
    latest = max(ends)
    return [latest - end for end in ends]


def projected_ends(remaining: Sequence[int], waiting: int, budget: int) -> list[int]:
    """Each slot's end in a last wave, in passes from now at one token a pass (:func:`last_wave`): its request's
    ``remaining`` tokens, plus ``budget`` for the ``waiting`` slots that free first (a newcomer's prompt is prefilled
    in the pass that decodes the others' roots, its first token with it)."""
    if not 0 <= waiting <= len(remaining):
        raise ValueError(f"a last wave has at most one waiting request a slot: {waiting} for {len(remaining)}")
    order = sorted(range(len(remaining)), key=lambda i: (remaining[i], i))
    ends = list(remaining)
    for i in order[:waiting]:
        ends[i] += budget
    return ends


def end_odds(behind: Sequence[int], horizon: int, spread: float, pace: float = 1.0, points: int = 257,
             least: float = 0.01) -> list[float]:
    """Each slot's chance of ending the batch: slot i has ``horizon - behind[i]`` tokens to its projected end (at one
    token a pass); at ``pace`` tokens a pass, each pass's advance varying by ``spread`` tokens independently of the
    other slots', its end is about normal, n = (horizon - behind[i]) / pace passes away with standard deviation
    spread sqrt(n) / pace (a renewal count). The chance that it is the latest, chances under ``least`` counted as 0
    (a slot that far ahead is worth nothing to the batch), the rest scaled to sum to 1. With ``spread`` 0 the slots
    at the latest end share it equally, as do slots all tied (by symmetry, without the grid: the 32/32 sweep's
    waves are tied on most passes). The grid is numpy's: on arrays this small each torch op's dispatch is host work
    every pass (docs/batching-log.md, session 26)."""
    if not behind:
        return []
    if min(behind) == max(behind):
        return [1.0 / len(behind)] * len(behind)
    mean = np.array([float(horizon - b) for b in behind])
    if spread <= 0 or pace <= 0:
        last = mean == mean.max()
        return (last / last.sum()).tolist()
    mean = np.maximum(mean, 1.0) / pace
    sd = spread * np.sqrt(mean) / pace
    grid = np.linspace(float((mean - 8 * sd).min()), float((mean + 8 * sd).max()), points)
    z = (grid[None] - mean[:, None]) / sd[:, None]  # (slots, points)
    density = np.exp(-0.5 * z**2) / (sd[:, None] * math.sqrt(2 * math.pi))
    below = np.maximum(special.ndtr(z), 1e-300)
    logs = np.log(below)
    others = np.exp(logs.sum(0, keepdims=True) - logs)  # the other slots all end sooner
    odds = integrate.trapezoid(density * others, grid, axis=1)
    odds = np.where(odds / odds.sum() < least, 0.0, odds)
    return (odds / odds.sum()).tolist()


def finishing(prospects: Sequence, remaining: Sequence[int], waiting: int = 0, budget: int = 0) -> list:
    """The prospects (``batch_lengths.Prospect``) valued for a batch in its last wave (:func:`last_wave`: the
    ``waiting`` requests of ``budget`` tokens each go to the slots that free first). The batch's remaining time is
    the passes its last slot still needs, so a request's token is worth its slot's chance of being that last one
    (:func:`end_odds`, spread by what the prospects' own acceptance makes a pass
    vary): far from the end tied slots share it, and a slot well ahead of the others is worth nothing (its tokens
    would end it sooner but not the batch, and a narrower batch costs about as much a pass). Each prospect also
    carries how many passes its slot's end is before the batch's (``behind``) and the passes to that end
    (``horizon``): :func:`near_end` plans the last passes jointly, where a slot b behind drafts only to keep pace
    with the last slots' levels past b. Re-decided every pass."""
    behind = behind_ends(remaining, waiting, budget)
    horizon = max(projected_ends(remaining, waiting, budget), default=0)
    tied = min(behind, default=0) == max(behind, default=0)  # end_odds shares it equally whatever the spread
    odds = end_odds(behind, horizon, *((0.0, 1.0) if tied else _pace(prospects)))
    # built directly, as batch_lengths._at_contexts does: ``replace`` inspects the fields on every call
    return [type(p)(p.acceptance, p.rows, v, b, horizon, p.context, p.start) for p, b, v in zip(prospects, behind,
                                                                                              odds, strict=True)]


def near_end(prospects: Sequence) -> bool:
    """Whether a last wave's batch ends within two passes of its deepest draft (planned jointly, one pass's picture:
    :func:`plan_together`); further off its slots' tokens are valued by their odds of
    ending it (:func:`finishing`)."""
    deepest = max((len(p.acceptance) for p in prospects), default=0)
    return max((p.horizon for p in prospects), default=0) <= 2 * deepest


def _pace(prospects: Sequence) -> tuple[float, float]:
    """(the standard deviation of a pass's accepted tokens, the tokens a pass commits), drafting every depth,
    averaged over the prospects that draft (A with P(A >= d) = reach_d: E[A] = sum reach_d, E[A^2] = sum (2d - 1)
    reach_d); (0, 1) when none does."""
    means, variances = [], []
    for prospect in prospects:
        reach = list(itertools.accumulate(prospect.acceptance, operator.mul))
        if reach:
            means.append(sum(reach))
            variances.append(sum((2 * d - 1) * r for d, r in enumerate(reach, start=1)) - means[-1] ** 2)
    if not means:
        return 0.0, 1.0
    return math.sqrt(max(0.0, statistics.fmean(variances))), 1.0 + statistics.fmean(means)
