"""Per-request draft lengths for the batch's goodput (TurboSpec/SmartSpec; vLLM's adaptive verification).

A batched pass feeds each request its root plus its own draft, packed (``specfamily.runtime.batch_lean``: padding
costs nothing), so the pass costs t(B, N) for B requests feeding N rows in all, plus what its rows' attention costs
over their slots' cached contexts: :class:`~specfamily.core.batch_costs.RowCosts` learns both from the run's own
passes (``core/batch_costs.py``), and the seconds of one batched draft step per B.

:func:`plan_lengths` gives each request its own draft length: every next draft level of every request is a unit of
expected gain (the probability that the request accepts that deep, from its own per-depth acceptance) and of rows
(the level's draft tokens); in the order of gain (the greedy marginal: the next token goes to the request whose next
level gains most, as every row costs the batch the same), the plan is the prefix with the most expected committed
tokens per second of the whole pass,

    goodput = (B + sum of the units' gains) / (t(B, B + their rows) + k_row * their rows' contexts + deepest * s(B)),

(t(B, N) at the slots' contexts, k_row a draft row's seconds per cached token of its slot),

and none when no prefix beats a plain pass. :class:`LengthPolicy` adds what measuring needs: a plain pass first at
each B, one level for every request while a drafted pass cannot be predicted yet, a plain pass again every
``refresh_every`` drafted passes, and while drafting does not pay, a probe every ``probe_every`` passes, backing off.
What each drafted pass realized is checked against what its plan predicted (:class:`Realized`, over a doubtful prior,
kept across runs per drafter and B: ``core/batch_goodput.py``): a load whose drafts keep under-delivering has its
predictions scaled down until it stops drafting but for probes. At the batch's end its tied longest requests draft
together or not at all, and a slot b passes behind them only the levels past b that keep pace with theirs
(:func:`~specfamily.core.batch_goodput.plan_together`).
A request whose draft is deterministic and seen before the plan (``Prospect.seen``: prompt lookup and suffix, asked
for their longest draft first) is planned with what it actually proposed: no match, no rows. Lengths never change a
greedy text, and are chosen before anything of the pass is drawn.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specfamily.core.batch_costs import RowCosts
from specfamily.core.batch_goodput import (
    Realized,
    backoff,
    correction,
    finishing,
    near_end,
    plan_together,
    realized_gain,
)
from specfamily.core.batch_tally import Tally, kept_tally
from specfamily.core.types import Draft

__all__ = ["LengthPolicy", "Prospect", "Realized", "RowCosts", "Tally", "finishing", "kept_tally", "pay_bound",
           "plan_lengths", "proposing", "realized_gain", "truncated"]


@dataclass(frozen=True)
class Prospect:
    """One request's prospects this pass: its per-depth acceptance (as many depths as it may draft) and the draft
    rows each level adds (known for a draft already proposed; else its drafter's tokens per level)."""

    acceptance: Sequence[float]
    rows: Sequence[int]
    value: float = 1.0  # what one of its committed tokens is worth to the batch (0: nothing, see ``finishing``)
    behind: int = 0  # in a last wave: passes its slot's projected end is before the batch's (``finishing``)
    horizon: int = 0  # in a last wave: passes to the batch's projected end at one token a pass (``finishing``)
    context: int = 0  # its slot's cached tokens: each of its draft rows attends them (``RowCosts.row_token``)
    start: float = 0.0  # seconds its drafter spends catching up before its first level, if it drafts (batch_catchup)

    @classmethod
    def planned(cls, acceptance: Sequence[float], width: float, limit: int, start: float = 0.0) -> Prospect:
        """A draft not proposed yet: up to ``limit`` levels of ``width`` tokens each, after ``start`` seconds."""
        limit = min(limit, len(acceptance))
        fed = [math.ceil(g * width - 1e-9) for g in range(limit + 1)]
        return cls(acceptance[:limit], [b - a for a, b in zip(fed, fed[1:], strict=False)], start=start)

    @classmethod
    def seen(cls, acceptance: Sequence[float], draft: Draft) -> Prospect:
        """A deterministic draft already proposed: its levels as they are (none when it found nothing)."""
        if not len(draft):
            return cls((), ())
        counts = torch.bincount(draft.depths())[1:].tolist()
        depths = min(len(counts), len(acceptance))
        return cls(acceptance[:depths], counts[:depths])


def plan_lengths(prospects: Sequence[Prospect], seconds: Sequence[float], step: float,
                 drafted: bool = False, row_token: float = 0.0) -> tuple[list[int], float]:
    """(each request's draft length, the plan's goodput over a plain pass's): the best prefix of the units in the
    order of gain (``drafted``: the best that drafts anything). ``seconds[N]``: t(B, N) for every N the units can
    reach (at the slots' contexts); ``step``: one draft level's seconds for the batch; ``row_token``: a draft row's
    seconds per cached token of its slot (``Prospect.context``); a request drafted at all adds its ``Prospect.start``.
    A request's tokens count ``Prospect.value`` each (1 unless :func:`finishing` says otherwise), its expected gain
    too."""
    batch = len(prospects)
    units = []  # (-gain, request, depth)
    for i, prospect in enumerate(prospects):
        reach = prospect.value
        for depth, alpha in enumerate(prospect.acceptance, start=1):
            reach *= alpha
            if reach <= 0:
                break
            units.append((-reach, i, depth))
    units.sort()
    tokens, rows, deepest, attended = float(sum(p.value for p in prospects)), batch, 0, 0.0
    if tokens <= 0:
        return [0] * batch, 1.0
    plain = tokens / seconds[batch]
    best, best_rate, started = 0, (0.0 if drafted else plain), 0.0
    for k, (gain, i, depth) in enumerate(units, start=1):
        added = prospects[i].rows[depth - 1]
        tokens, rows, deepest = tokens - gain, rows + added, max(deepest, depth)
        attended += added * prospects[i].context
        started += prospects[i].start if depth == 1 else 0.0  # a request's levels come in order of depth
        if rows >= len(seconds):
            break
        rate = tokens / (seconds[rows] + row_token * attended + deepest * step + started)
        if rate > best_rate:
            best, best_rate = k, rate
    lengths = [0] * batch
    for _, i, depth in units[:best]:
        lengths[i] = max(lengths[i], depth)
    return lengths, (best_rate / plain if best else 1.0)


def pay_bound(prospects: Sequence[Prospect], seconds: Sequence[float], step: float, share: float = 1.0,
              row_context: float = 0.0) -> float:
    """An upper bound on the goodput over a plain pass's of any plan on ``prospects`` (:func:`plan_lengths`, a
    probe's, :func:`_joint`'s), whatever values their slots are given, each at most ``share`` of their sum (all alike:
    1 / B): a plan feeding n draft rows gains at most ``share`` times the n likeliest levels' reaches and at most one
    request's first n levels (every level feeds a row), and costs at least t(B, B + n) + one draft step + n rows at
    ``row_context`` (a draft row's seconds at the least slot's context). Infinite when a level feeds no row."""
    if any(n < 1 for p in prospects for n in p.rows[: len(p.acceptance)]):
        return math.inf
    batch = len(prospects)
    reaches = [list(itertools.accumulate(p.acceptance, operator.mul)) for p in prospects]
    top = list(itertools.accumulate(sorted((r for each in reaches for r in each), reverse=True)))
    own = [list(itertools.accumulate(each)) for each in reaches if each]
    deepest = max(map(len, own), default=0)  # past it, one request's first n levels are its whole: the best one's stays
    alone = [max(o[min(n, len(o)) - 1] for o in own) for n in range(1, deepest + 1)]
    best = 1.0
    for n in range(1, min(len(top), len(seconds) - 1 - batch) + 1):
        gain = min(share * top[n - 1], alone[min(n, deepest) - 1])
        best = max(best, (1.0 + gain) * seconds[batch] / (seconds[batch + n] + step + row_context * n))
    return best


_NOTHING = Prospect((), ())  # a slot's prospects on a pass not planned (``LengthPolicy.held``)
Decision = tuple[list[int], float, str]  # a plan's lengths, its predicted gain and its kind (LengthPolicy._decide)


@dataclass
class LengthPolicy:
    """Each request's draft length on each steady batched pass (every live request past its prefill)."""

    min_gain: float = 1.02  # a plan must beat a plain pass's goodput by this factor (a noise margin)
    probe_every: int = 16
    max_backoff: int = 3  # probes at a load that keeps losing: every probe_every * 2**k passes, k <= max_backoff
    refresh_every: int = 32
    costs: RowCosts = field(default_factory=RowCosts)
    idle: dict[int, int] = field(default_factory=dict)  # B -> plain passes in a row since drafting last paid
    losing: dict[int, int] = field(default_factory=dict)  # B -> probes in a row after which drafting did not pay
    unrefreshed: dict[int, int] = field(default_factory=dict)  # B -> drafted passes since its last plain one
    choices: dict[int, list[int]] = field(default_factory=dict)  # B -> draft rows planned on every pass at B
    realized: dict[int, Realized] = field(default_factory=dict)  # B -> drafted passes' gains (batch_goodput)
    predicted: tuple | None = None  # the last plan that drafted, not jointly: (B, its gain, the values, contexts)
    priced: float | None = None  # the last timed pass's t(B, B) at its contexts, if it drafted nothing (``settle``)
    joint_only: bool = False  # last waves plan jointly only, near their end or not (``batch_waves``)
    kind: str = ""  # the kind of the last plan recorded (``_decide``)

    def may_draft(self, batch: int) -> bool:
        """Whether a pass of ``batch`` requests may draft at all (its plain pass measured, no refresh due)."""
        return self.costs.known(batch, batch) and self.unrefreshed.get(batch, 0) < self.refresh_every

    def lengths(self, prospects: Sequence[Prospect], proposed: bool = False, together: bool = False,
                contexts: Sequence[int] | None = None, decided: Decision | None = None) -> list[int]:
        """Each request's draft length (``proposed``: the drafts are already proposed, their time spent;
        ``together``: the batch's end, its valued requests tied: they draft to one depth or none does,
        :func:`~specfamily.core.batch_goodput.plan_together`; ``contexts``: each slot's cached tokens, priced;
        ``decided``: :meth:`decision` on these same arguments (``proposed`` true), nothing recorded since: it is
        not made again)."""
        batch = len(prospects)
        self.predicted = None
        if contexts is not None:
            prospects = _at_contexts(prospects, contexts)
        lengths = self._plan(batch, prospects, proposed, together, decided)
        self.choices.setdefault(batch, []).append(sum(sum(p.rows[:g]) for p, g in zip(prospects, lengths,
                                                                                     strict=True)))
        return lengths

    def held(self, batch: int, kind: str) -> list[int]:
        """No draft for a pass of ``batch`` requests whose verdict to draft nothing, of ``kind``, holds
        (``batch_hold``): recorded as :meth:`lengths` records that verdict planned."""
        self.predicted = None
        lengths = self._plan(batch, [_NOTHING] * batch, True, False, ([0] * batch, 0.0, kind))
        self.choices.setdefault(batch, []).append(0)
        return lengths

    def decision(self, prospects: Sequence[Prospect], together: bool = False,
                 contexts: Sequence[int] | None = None) -> Decision:
        """:meth:`lengths`' plan on these prospects (already proposed), recording nothing: (lengths, predicted gain,
        kind), a probe included. The batched loop asks it on each slot's longest possible chain before proposing
        under lookahead and skips proposals no plan could use (docs/batching-log.md, sessions 25-26); pass it to
        :meth:`lengths` as ``decided`` to record it without planning twice."""
        if contexts is not None:
            prospects = _at_contexts(prospects, contexts)
        return self._decide(len(prospects), prospects, True, together)

    def hopeless(self, prospects: Sequence[Prospect], proposed: bool = False, share: float = 1.0,
                 contexts: Sequence[int] | None = None) -> bool:
        """Whether :meth:`_decide` on ``prospects``, planned apart (not the joint plan of a batch's end) and valued
        anyhow (each slot at most ``share`` of their sum, some slot with levels valued above 0), would plan an idle
        pass, told without valuing or planning them: no probe is due, the table is measured, and :func:`pay_bound`
        times the correction is within ``min_gain``. Records nothing; pass ``(zeros, 0.0, "idle")`` to
        :meth:`lengths` as ``decided`` to record the idle pass (docs/batching-log.md, session 27)."""
        batch = len(prospects)
        if not any(p.acceptance for p in prospects) or not self.may_draft(batch) or self.probe_due(batch):
            return False
        contexts = [0] * batch if contexts is None else contexts
        seconds = self.costs.table(batch, batch + sum(sum(p.rows) for p in prospects), sum(contexts), proposed)
        if seconds is None:
            return False
        step = 0.0 if proposed else self.costs.draft_step(batch)
        bound = pay_bound(prospects, seconds, step, share, self.costs.row_token() * min(contexts))
        return bound * self.correction(batch) <= self.min_gain

    def probe_due(self, batch: int) -> bool:
        """Whether a pass at ``batch`` on which nothing pays would be a probe (every ``probe_every`` idle passes,
        backing off while probes keep losing)."""
        losing = self.losing.get(batch)
        losing = backoff(self.realized, batch) if losing is None else losing
        return self.idle.get(batch, 0) + 1 >= self.probe_every * 2 ** min(losing, self.max_backoff)

    def _decide(self, batch: int, prospects: Sequence[Prospect], proposed: bool, together: bool) -> Decision:
        """The plan on ``prospects``, recording nothing: (lengths, predicted gain, kind), kind one of ``none``
        (nothing to plan), ``explore`` (no drafted pass measured yet: one level each), ``joint`` (the batch's end,
        its tied requests together), ``pays``, ``idle`` (nothing pays, no probe due) and ``probe``."""
        if not any(p.acceptance and p.value > 0 for p in prospects) or not self.may_draft(batch):
            return [0] * batch, 0.0, "none"
        seconds = self.costs.table(batch, batch + sum(sum(p.rows) for p in prospects),
                                   sum(p.context for p in prospects), proposed)
        if seconds is None:  # a drafted pass cannot be predicted yet: measure the cheapest one
            return [1 if p.acceptance and p.value > 0 else 0 for p in prospects], 0.0, "explore"
        step = 0.0 if proposed else self.costs.draft_step(batch)
        if together and (self.joint_only or near_end(prospects)):  # the batch's last passes: jointly, if it pays
            lengths, gain = _joint(prospects, seconds, step, self.costs.row_token())
            pays = any(lengths) and gain * self.correction(batch) > self.min_gain
            return (lengths if pays else [0] * batch), gain, "joint"
        lengths, gain = plan_lengths(prospects, seconds, step, row_token=self.costs.row_token())
        if any(lengths) and gain * self.correction(batch) > self.min_gain:
            return lengths, gain, "pays"
        if not self.probe_due(batch):
            return [0] * batch, gain, "idle"
        lengths, gain = plan_lengths(prospects, seconds, step, True, self.costs.row_token())  # a probe: estimates
        return lengths, gain, "probe"

    def _plan(self, batch: int, prospects: Sequence[Prospect], proposed: bool, together: bool,
              decided: Decision | None = None) -> list[int]:
        """:meth:`_decide`'s lengths (or ``decided``'s, already made), recording what the plan keeps: idle passes,
        probes and their back-off, the pending prediction a drafted pass settles."""
        lengths, gain, kind = decided or self._decide(batch, prospects, proposed, together)
        self.kind = kind
        prediction = (batch, gain, [p.value for p in prospects], sum(p.context for p in prospects))
        if kind == "pays":
            self.idle[batch] = 0
            self._lost(batch, 0)
            self.predicted = prediction
        elif kind == "idle":
            self.idle[batch] = self.idle.get(batch, 0) + 1
            if batch not in self.losing:
                self.losing[batch] = backoff(self.realized, batch)
        elif kind == "probe":
            self.idle[batch] = 0
            self._lost(batch, self.losing.setdefault(batch, backoff(self.realized, batch)) + 1)
            self.predicted = prediction if any(lengths) else None  # kept current
        return lengths

    def _lost(self, batch: int, probes: int) -> None:
        """The probes in a row that did not pay at ``batch``, here and in its kept record (a later run at a load
        whose probes kept losing starts backed off)."""
        self.losing[batch] = self.realized.setdefault(batch, Realized()).losing = probes

    def correction(self, batch: int) -> float:
        """What drafted passes at ``batch`` (or, while it has few, the nearest load) realized over what their plans
        predicted, over a doubtful prior (:class:`~specfamily.core.batch_goodput.Realized`)."""
        return correction(self.realized, batch)

    def settle(self, committed: Sequence[int], seconds: float) -> None:
        """The last planned pass committed ``committed`` tokens per request (accepted + 1) in ``seconds`` (draft,
        forward, verification, commit): if it drafted, its realized gain is learned against its predicted one, over
        a plain pass at its B valued as the plan valued it; if it drafted nothing, its seconds against the t(B, B)
        it was priced at are the load's yardstick (``Realized.baseline``). A probe that paid ends the back-off. A
        joint pass at the batch's end is neither learned nor probed: its advance (the least of its tied requests'
        acceptances) swings far from its expectation pass by pass, and a window of them held back the next run's
        plans at that load (docs/batching-log.md, session 23)."""
        if self.predicted is None:
            if self.priced is not None:  # an undrafted pass: the yardstick of drafted ones (``Realized.baseline``)
                kept = self.realized.get(len(committed))  # not setdefault: a Realized built every pass for nothing
                if kept is None:
                    kept = self.realized[len(committed)] = Realized()
                kept.add_plain(self.priced, seconds)
            self.priced = None
            return
        (batch, gain, values, slots), self.predicted = self.predicted, None
        plain = self.costs.measured(batch, batch, slots)  # a plain pass at the pass's contexts
        if plain is None or len(committed) != batch:
            return
        tokens, plain_tokens = sum(v * c for v, c in zip(values, committed, strict=True)), sum(values)
        realized = realized_gain(tokens, seconds, plain_tokens, plain)
        self.realized.setdefault(batch, Realized()).add(gain, realized)
        if realized > self.min_gain:
            self._lost(batch, 0)

    def timed(self, batch: int, rows: int, steps: int, draft_seconds: float, seconds: float, slots: float = 0.0,
              drafted: float = 0.0, host: float | None = None, after: float = 0.0) -> None:
        """A steady pass over ``batch`` requests of ``rows`` fed rows in all, after ``steps`` draft steps that took
        ``draft_seconds``, took ``seconds`` (forward, verification, commit); its slots held ``slots`` cached tokens
        and its draft rows attended ``drafted`` (``RowCosts.observe``); ``host``: its seconds outside the forward,
        if measured, ``after`` of them after it (``RowCosts.observe``)."""
        self.priced = self.costs.measured(batch, batch, slots) if rows == batch else None  # before it is observed
        self.costs.observe(batch, rows, seconds, slots, drafted, host, after)
        if steps > 0:  # else nothing to observe (the call alone is host work every undrafted pass)
            self.costs.observe_draft(batch, steps, draft_seconds)
        self.unrefreshed[batch] = self.unrefreshed.get(batch, 0) + 1 if rows > batch else 0

    def describe(self) -> str:
        """Per batch size: the passes planned, the share that drafted, the draft rows per pass."""
        parts = []
        for batch, rows in sorted(self.choices.items()):
            drafted = sum(r > 0 for r in rows) / len(rows)
            parts.append(f"B={batch}: {len(rows)} passes, {drafted:.0%} drafted, "
                         f"{sum(rows) / len(rows):.1f} draft rows a pass")
        return "draft lengths per request by goodput: " + ("; ".join(parts) if parts else "no steady batched pass")


def _at_contexts(prospects: Sequence[Prospect], contexts: Sequence[int]) -> list[Prospect]:
    """The prospects at their slots' cached lengths (built directly: ``dataclasses.replace`` inspects the fields on
    every call, host work between two forwards; docs/batching-log.md, session 27)."""
    return [Prospect(p.acceptance, p.rows, p.value, p.behind, p.horizon, c, p.start) for p, c in zip(prospects,
                                                                                                     contexts,
                                                                                                     strict=True)]


def _joint(prospects: Sequence[Prospect], seconds: Sequence[float], step: float, row_token: float = 0.0,
           drafted: bool = False) -> tuple[list[int], float]:
    """:func:`plan_lengths` for a batch's end: the valued requests (tied at the most tokens left) draft to one depth k
    together or not at all, a request ``behind`` b passes drafts k - b levels
    (:func:`~specfamily.core.batch_goodput.plan_together`)."""
    if not any(p.value > 0 for p in prospects):
        return [0] * len(prospects), 1.0
    reaches = [list(itertools.accumulate(p.acceptance, operator.mul)) for p in prospects]
    behind = [p.behind for p in prospects]
    attended = [[n * p.context for n in p.rows] for p in prospects]  # each level's draft rows' cached tokens
    depth, gain = plan_together(reaches, [p.rows for p in prospects], seconds, step, len(prospects), drafted, behind,
                                (attended, row_token), [p.start for p in prospects])
    return [max(0, depth - b) for b in behind], gain


def truncated(draft: Draft, depth: int) -> Draft:
    """A deterministic draft cut to its first ``depth`` levels (the nodes keep their order; parents renumbered)."""
    if depth <= 0:
        return Draft.empty()
    keep = draft.depths() <= depth
    if bool(keep.all()):
        return draft
    index = keep.nonzero().flatten()
    renumber = torch.cumsum(keep.long(), 0) - 1
    parents = draft.parents[index]
    parents = torch.where(parents < 0, parents, renumber[parents.clamp(min=0)])
    return Draft(draft.tokens[index], parents, None, catch_up_seconds=draft.catch_up_seconds, evidence=draft.evidence)


def proposing(acceptance: list[float], rate: float) -> list[float]:
    """Per-depth acceptance of a drafter that proposes anything in only a ``rate`` share of the passes it is asked
    to (an n-gram drafter without a match proposes nothing): its expected gain is ``rate`` times the gain of a
    proposal, so depth 1's acceptance is scaled by it."""
    return [acceptance[0] * rate, *acceptance[1:]] if acceptance else []
