"""How the batched loop plans each pass's draft lengths (a part of :class:`specfamily.core.batch_loop._Batch`).

On a pass that prefills newcomers, each slot's own policy's length (none under draft length by load); on a steady pass
under draft length by load, the lengths :class:`~specfamily.core.batch_lengths.LengthPolicy` plans for the batch's
goodput from each request's acceptance (its own counts over the batch's pool over the drafter's prior) and the
measured row costs, valued as the batch's last wave values them (:mod:`specfamily.core.batch_goodput`); with cheap
deterministic drafters (lookahead, learned) proposed at full length first and planned on the drafts themselves.
"""

from __future__ import annotations

import statistics
from collections import deque

from specfamily.core.batch_goodput import behind_ends, projected_ends, wave_of
from specfamily.core.batch_lengths import Prospect, finishing, proposing, truncated
from specfamily.core.batch_requests import Request
from specfamily.core.types import Draft

__all__ = ["BatchPlanning"]

_IDLE = "idle"  # the kind LengthPolicy records for a pass on which nothing pays and no probe is due
_LOOKAHEAD_SHARE = 0.05  # proposing at full length first costs at most this share of a plain pass (see _learn)
_POOL_WEIGHT, _OWN_WEIGHT = 2.0, 4.0  # passes the drafter's prior is worth to the batch's pool, the pool to a request


class BatchPlanning:
    """The planning half of the batched loop: its methods read the loop's ``load`` (LengthPolicy or None), ``hold``
    (a ``batch_hold.VerdictHold``), ``deepest`` (the levels a slot's drafter may draft), ``catch_up`` (a
    ``batch_catchup.CatchUp``), ``lookahead``, ``proposal_seconds``, ``pooled``, ``evidence``, ``prototype``,
    ``wave``, ``budget``, ``batch``, ``live``, ``cost_clock``, ``clock``, ``origin``, ``waves`` and ``wave_pass``."""

    def _planned(self, group: list[Request], gammas: list[int], drafts: list[Draft], c0: float) -> list[Draft]:
        """A steady pass's drafts as fed: proposed at full length under lookahead, then cut to the lengths planned on
        what they hold (exact: they are deterministic, nothing was drawn); else as proposed."""
        for request, gamma, draft in zip(group, gammas, drafts, strict=True):
            request.asked += gamma > 0
            request.given += gamma > 0 and len(draft) > 0
        if self.lookahead and any(gammas):
            self._learn(group, drafts, self.cost_clock() - c0)
            if any(d.q is not None or d.side is not None for d in drafts):
                return drafts  # drafts that were drawn are fed as they are: their lengths were planned before
            pooled = self._pooled()
            for r, d in zip(group, drafts, strict=True):
                self.evidence.hold(r.index, d, len(r.new_tokens))
            prospects = [Prospect.seen(self._valued_alpha(r, d, pooled), d) for r, d in zip(group, drafts, strict=True)]
            lengths = self._lengths(group, prospects, proposed=True)
            return [truncated(d, g) for d, g in zip(drafts, lengths, strict=True)]
        if self.lookahead is None and any(len(d) for d in drafts):
            self._learn(group, drafts, self.cost_clock() - c0)
        return drafts

    def _learn(self, group: list[Request], drafts: list[Draft], seconds: float) -> None:
        """Whether to plan on the drafts themselves (lookahead): after the first steady pass that drafted, and again
        on every lookahead pass, yes while every draft is deterministic and proposing (at full length, under
        lookahead) measured at most ``_LOOKAHEAD_SHARE`` of a plain pass, median of the latest: prompt lookup and
        suffix, whose proposals cost next to nothing whatever their length."""
        self.proposal_seconds.append(seconds)
        plain = self.load.costs.measured(len(group), len(group), sum(self._contexts(group)))
        cheap = plain is not None and statistics.median(self.proposal_seconds) <= _LOOKAHEAD_SHARE * plain
        self.lookahead = cheap and all(d.q is None and d.side is None for d in drafts)

    def _prefill_gammas(self, group: list[Request]) -> list[int]:
        """Draft lengths on a pass that prefills newcomers: each slot's own policy's, but none under draft length by
        load: nothing measured prices drafting beside a prefill, and under load the draft rows added to every
        newcomer's prompt rows cost more than the token or so each request gains (docs/batching-log.md)."""
        if self.load is not None:
            return [0] * len(group)
        return [0 if r.drafter is None else self._capped(r, r.drafter.policy.next_gamma()) for r in group]

    def _capped(self, request: Request, gamma: int) -> int:
        """``gamma``, cut so that no pass drafts past the request's token budget."""
        return max(0, min(gamma, self.budget - len(request.new_tokens) - 1))

    def _load_gammas(self, group: list[Request]) -> list[int]:
        """Each request's draft length for this pass: :meth:`_plan_gammas`, or none while a verdict to draft
        nothing holds (``batch_hold``: recorded as the pass's plan, not planned again)."""
        self._wave_before(group)
        key = self._hold_key(group)
        kind = self.hold.held(key, self.load.probe_due(len(group)))
        if kind is not None:
            return self.load.held(len(group), kind)
        gammas = self._plan_gammas(group)
        self.hold.keep(key, self.load.kind, any(gammas), len(group))
        return gammas

    def _hold_key(self, group: list[Request]) -> tuple:
        """What a verdict to draft nothing rests on beyond the drift of one pass (``batch_hold``): the slots, the
        wave, whether the batch is within its joint end (``batch_goodput.near_end`` on the deepest each slot may
        draft), the policy's joint-only and lookahead. Not the acceptance counts: they grow only on a pass that
        drafted, which no verdict held survives."""
        near = self.wave_pass is not None and \
            self.wave_pass[0] <= 2 * max(self._capped(r, self.deepest) for r in group)
        return tuple(r.index for r in group), self.wave, near, self.load.joint_only, self.lookahead

    def _plan_gammas(self, group: list[Request]) -> list[int]:
        """Each request's draft length planned anew: under lookahead its longest (cut once the drafts are seen),
        else planned for the batch's goodput from its own acceptance estimate and the measured row costs."""
        if self.lookahead:
            if not self.load.may_draft(len(group)):
                return self.load.lengths([Prospect((), ())] * len(group))
            longest = [self._capped(r, len(r.drafter.policy.acceptance())) for r in group]
            pooled = self._pooled()  # each slot's best case: a chain of its longest draft, one row a level
            rate = self.catch_up.per_token()
            chains = [Prospect(self._case_alpha(r, pooled)[:g], [1] * g, start=self._start(r, rate))
                      for r, g in zip(group, longest, strict=True)]
            contexts = self._contexts(group)
            valued = self._worth(group, chains, True, contexts)
            if valued is None:  # nothing could pay: the idle pass recorded, neither valued nor planned
                return self.load.lengths(chains, True, False, contexts, ([0] * len(group), 0.0, _IDLE))
            decided = self.load.decision(valued[0], valued[1], contexts)
            if any(decided[0]):
                return longest
            self.load.lengths(valued[0], True, valued[1], contexts, decided)  # the pass's record, not planned again
            return [0] * len(group)
        if not self.load.may_draft(len(group)):  # nothing to plan: no acceptance, odds nor table this pass
            return self.load.lengths([Prospect((), ())] * len(group))
        prospects, pooled, rate = [], self._pooled(), self.catch_up.per_token()
        for r in group:
            alpha = proposing(self._alpha(r, pooled), (r.given + 1) / (r.asked + 1))
            prospects.append(Prospect.planned(alpha, r.drafter.policy.width, self._capped(r, len(alpha)),
                                              self._start(r, rate)))
        return self._lengths(group, prospects)

    def _start(self, request: Request, rate: float) -> float:
        """Seconds the request's drafter would spend catching up before drafting (``batch_catchup``): the tokens
        committed since it last proposed, at ``rate`` seconds a token, spread over the passes the request has left
        at most (once caught up it drafts on from there: a restart serves the rest of the request)."""
        return (len(request.ctx.tokens) - request.synced) * rate / max(1, self.budget - len(request.new_tokens))

    def _lengths(self, group: list[Request], prospects: list[Prospect], proposed: bool = False) -> list[int]:
        """``LengthPolicy.lengths`` on the prospects as the batch values them (:meth:`_worth`), or the idle pass
        recorded without valuing nor planning them when no plan on them could pay."""
        contexts = self._contexts(group)
        valued = self._worth(group, prospects, proposed, contexts)
        if valued is None:
            return self.load.lengths(prospects, proposed, False, contexts, ([0] * len(group), 0.0, _IDLE))
        return self.load.lengths(valued[0], proposed, valued[1], contexts)

    def _worth(self, group: list[Request], prospects: list[Prospect], proposed: bool,
               contexts: list[int]) -> tuple[list[Prospect], bool] | None:
        """(the prospects as the batch values them, whether its tied last slots plan together), or None when no plan
        on them could pay however they are valued (``LengthPolicy.hopeless``; the batch's last passes, planned
        jointly, are always valued). Every token alike (values 1, not together) outside a last wave, and in one
        whose slots are tied at their projected ends, not near the end: ``finishing`` would value each 1 / B, and a
        plan's goodput over a plain pass's is the same whatever value all its slots share; else ``_valued``."""
        share, tied = 1.0 / len(group), True
        if self.wave is not None:
            remaining = [self.budget - len(r.new_tokens) for r in group]
            behind = behind_ends(remaining, self.wave, self.budget)
            deepest = max((len(p.acceptance) for p in prospects), default=0)
            if max(projected_ends(remaining, self.wave, self.budget)) <= 2 * deepest:  # near_end: planned jointly
                return self._valued(group, prospects), True
            tied = min(behind) == max(behind)
            share = share if tied else 1.0
            if not any(p.acceptance for p, b in zip(prospects, behind, strict=True) if b == 0):
                return self._valued(group, prospects), True  # its plan is none, not idle: valued as before
        if self.load.hopeless(prospects, proposed, share, contexts):
            return None
        return (prospects, False) if tied and not self.load.joint_only else (self._valued(group, prospects), True)

    def _horizon(self, group: list[Request]) -> int:
        """The batch's projected end in a last wave, tokens at one a pass (``batch_goodput.projected_ends``)."""
        return max(projected_ends([self.budget - len(r.new_tokens) for r in group], self.wave, self.budget))

    def _wave_before(self, group: list[Request]) -> None:
        """At a steady pass's start: in a last wave, the batch's projected end and a plain pass's price now."""
        self.wave_pass = None
        if self.wave is not None:
            priced = self.load.costs.measured(len(group), len(group), sum(self._contexts(group)))
            self.wave_pass = (self._horizon(group), priced)

    def _wave_passed(self, group: list[Request], drafts: list[Draft], seconds: float) -> None:
        """After a steady pass measured from its plan on: a last-wave pass's record in the run's ledger
        (``batch_waves``)."""
        if self.wave_pass is None:
            return
        (before, priced), self.wave_pass = self.wave_pass, None
        advance = self._advance(group, before)
        drafted = any(len(d) for d in drafts)
        self.waves.record(advance, seconds, priced, drafted, drafted and self.load.kind in ("pays", "probe"))

    def _advance(self, group: list[Request], before: int) -> float:
        """How many tokens nearer a last-wave pass brought the batch's projected end (``before``: it at the pass's
        start); a request that ended before its budget (at EOS) moves the end by what plain decoding's would too, so
        its pass counts a plain pass's progress, 1."""
        early = any(r.done and len(r.new_tokens) < self.budget for r in group)
        return 1.0 if early else float(before - self._horizon(group))

    def _contexts(self, group: list[Request]) -> list[int]:
        """Each live slot's cached tokens (its draft rows attend them: ``RowCosts``)."""
        return self.batch.lengths[: len(group)]

    def _last_wave(self, waiting: deque, arrivals: list[float]) -> int | None:
        """``batch_goodput.wave_of``: the live slots still to free one for a waiting request, else None."""
        arrived = not waiting or arrivals[waiting[-1]] <= self.clock() - self.origin
        return wave_of(len(waiting), self.batch.cache.slots, len(self.live), arrived)

    def _held(self, waiting: deque, arrivals: list[float]) -> bool:
        """Whether the waiting requests wait for more free slots (``batch_goodput.wave_of``: in a last wave, once the
        live requests are past their prefill; a newcomer admitted this pass is prefilled with them anyway)."""
        return bool(self.live) and all(r.prefilled for r in self.live) and \
            self.batch.cache.slots - len(self.live) < len(waiting) and self._last_wave(waiting, arrivals) is not None

    def _valued(self, group: list[Request], prospects: list[Prospect]) -> list[Prospect]:
        """The prospects as the batch values them: every token alike while more requests wait than one a slot, or
        some have yet to arrive (throughput); in the last wave only the tokens of the slots projected to end last
        (``batch_goodput.last_wave``; with none waiting, the longest requests: ``batch_lengths.finishing``), which
        then draft together or not at all."""
        if self.wave is None:
            return prospects
        return finishing(prospects, [self.budget - len(r.new_tokens) for r in group], self.wave, self.budget)

    def _pooled(self) -> list[float]:
        """The batch's pooled per-depth acceptance over the drafter's prior (the prototype's policy, which never
        drafts; worth ``_POOL_WEIGHT`` passes): computed once a pass, shared by its requests."""
        return self.pooled.alpha(self.prototype.policy.acceptance(), _POOL_WEIGHT)

    def _case_alpha(self, request: Request, pooled: list[float]) -> list[float]:
        """A slot's case before it proposes: its own acceptance (:meth:`_alpha`), its text so far having decided its
        earlier proposals (:meth:`~specfamily.core.batch_evidence.Evidence.learn`). Not its best evidence bucket's:
        valued that way a slot proposes on nearly every pass (suffix at B=8: 234 proposals for 17 drafted) and its
        trees cost more than the plan then keeps (docs/batching-log.md, session 27)."""
        self.evidence.learn(request.index, request.new_tokens)
        return self._alpha(request, pooled)

    def _valued_alpha(self, request: Request, draft: Draft, pooled: list[float]) -> list[float]:
        """A proposed draft's per-depth acceptance: by its evidence where its drafter reports one
        (:class:`~specfamily.core.batch_evidence.Evidence`), else the request's own (:meth:`_alpha`)."""
        by_evidence = self.evidence.alpha(request.index, draft.evidence, pooled, len(request.new_tokens))
        return self._alpha(request, pooled) if by_evidence is None else by_evidence

    def _alpha(self, request: Request, pooled: list[float] | None = None) -> list[float]:
        """The request's per-depth acceptance: its own counts over ``pooled`` (:meth:`_pooled`, worth
        ``_OWN_WEIGHT`` passes), so a new request starts from what the run's requests accepted rather than from
        the prior."""
        return request.tally.alpha(self._pooled() if pooled is None else pooled, _OWN_WEIGHT)

