"""The batched decode loop: many requests, one target pass per step over every live request (continuous batching).

Each pass: every live request's drafter proposes (:func:`specfamily.core.batch_slots.propose_batch`), one target
forward scores each request's root plus draft (:class:`specfamily.core.batch_target.BatchTarget`, ragged drafts and
cache lengths), each request is verified on its own by the shared verifier with its own generator, and its cache
rolls back on its own. A request that is done retires at once and, with ``max_batch``, a waiting one takes its place;
a newly admitted request is prefilled in the next pass, beside the other requests' roots (its prompt is its pending
tokens; such a pass drafts only under each slot's own policy, never under draft length by load). Every request's law
is the one ``generate`` gives it (the verifier is exact per request); at temperature 0 its text is its batch-1 text, up
to near-ties that a pass of another shape rounds differently (none under the batch-invariant ``stream`` matmul).

With ``arrivals`` request i is admitted no earlier than ``arrivals[i]`` seconds after the call (the loop waits when
nothing is live); each result's metrics carry ``arrival_s``, ``first_token_s`` and ``finish_s`` (seconds since the
call) beside the fields ``generate`` fills, which count from the request's admission as ``generate``'s count from
its start. ``trace=True`` keeps every pass in ``result.trace`` as ``generate`` does (a pass's draft and verify seconds
are the batch pass's: the proposal time shared among the slots that drafted, the whole verification).
"""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from specfamily.core import batch_log
from specfamily.core.acceptance import verify_draft, verify_greedy_slots, verify_sampled_slots, walks_on_device
from specfamily.core.arrivals import LoopClock, arrival_order, check_arrivals
from specfamily.core.batch_catchup import kept_catch_up
from specfamily.core.batch_evidence import Evidence, kept_evidence
from specfamily.core.batch_gate import gated, kept_gate
from specfamily.core.batch_goodput import Realized, kept_realized
from specfamily.core.batch_hold import VerdictHold
from specfamily.core.batch_lengths import LengthPolicy, Prospect, RowCosts
from specfamily.core.batch_plan import BatchPlanning
from specfamily.core.batch_requests import BatchRequests, Request
from specfamily.core.batch_slots import SlotCopier, observe_batch, propose_batch
from specfamily.core.batch_tally import kept_tally
from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.batch_waves import WaveLedger, judge
from specfamily.core.costs import device_clock
from specfamily.core.drafter import Drafter, drafter_name
from specfamily.core.host import to_host
from specfamily.core.loop import (
    _check_request,
    _depth,
    _outcome,
    _planning_clock,
    _report,
    _tokens_at,
    _verified,
    generate,
    truncate,
)
from specfamily.core.policy import AutoPolicy
from specfamily.core.target import Target
from specfamily.core.types import Draft, GenerationResult, SamplingConfig, VerifyOutcome

__all__ = ["COMPILED_PASS_NOTE", "cache_capacity", "generate_batch"]

logger = logging.getLogger(__name__)
COMPILED_PASS_NOTE = (
    "compile='pass' compiles batch-1 passes only: generate_batch's batched passes run the eager lean forward, so at "
    "temperature 0 each request's text is its text under a Target without compile, and may differ from "
    "sf.generate's compiled text at near-ties (max_batch=1 runs sf.generate's compiled passes)")
_NOTED: weakref.WeakSet = weakref.WeakSet()  # targets whose compiled pass the batched loop has warned about

_HEADROOM = 64  # cache entries past the longest prompt plus the budget: a pass's draft rows

def generate_batch(
    target: Target,
    drafter: Drafter | None,
    prompts: Sequence,
    max_new_tokens: int = 64,
    sampling: SamplingConfig | None = None,
    seed: int = 0,
    max_batch: int | None = None,
    arrivals: Sequence[float] | None = None,
    trace: bool = True,
    clock: LoopClock | None = None,
) -> list[GenerationResult]:
    """Generate up to ``max_new_tokens`` after each prompt, at most ``max_batch`` requests at once (default: all):
    one GenerationResult per prompt, in order. Request i draws from its own generator seeded ``seed + i``, so its
    law (and, at temperature 0, its text) is what ``generate(..., seed=seed + i)`` gives it. ``drafter`` is the
    prototype each batch slot copies (``SlotCopier``; a copy serves request after request in its slot, as a drafter
    does at batch 1, begun and ended around each); with ``max_batch=1`` the requests run one after the other
    through ``generate`` itself, with ``drafter``. ``arrivals``: request i's arrival, seconds after the call (None:
    all at once); ``trace``: keep every pass in ``result.trace``; ``clock``: the loop's clock (a fake one in tests)."""
    sampling = SamplingConfig() if sampling is None else sampling
    _check_request(drafter, max_new_tokens, sampling)
    if isinstance(prompts, (str, bytes, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of token-id sequences, got {type(prompts).__name__}")
    ids = [target.check_ids(prompt) for prompt in prompts]
    max_batch = max(len(ids), 1) if max_batch is None else max_batch
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    arrived = check_arrivals(arrivals, len(ids))
    planning = clock.now if clock is not None else _planning_clock(target.device)  # times t(B, n) for the policy
    clock = LoopClock(device_clock(target.device)) if clock is None else clock
    if max_batch == 1 or len(ids) <= 1 or max_new_tokens == 0:
        return _one_by_one(target, drafter, ids, max_new_tokens, sampling, seed, arrived, trace, clock)
    _note_compiled(target)
    capacity = cache_capacity([len(p) for p in ids], max_new_tokens)
    batch = _Batch(target, drafter, sampling, seed, max_new_tokens, min(max_batch, len(ids)), capacity, clock,
                   planning or clock.now)
    return batch.run(ids, arrived, trace)


def cache_capacity(prompt_lengths: Sequence[int], max_new_tokens: int) -> int:
    """Entries per slot the batched cache is preallocated with for these prompts (it grows if a pass needs more)."""
    return max(prompt_lengths) + max_new_tokens + _HEADROOM


def _note_compiled(target: Target) -> None:
    """Warn once per target that its compiled pass (``compile="pass"``) is a batch-1 path the batched passes do not
    take (``COMPILED_PASS_NOTE``; docs/batching.md, "Lossless under batching")."""
    compiled = target.compiled_pass
    if compiled is not None and compiled.active and target not in _NOTED:
        _NOTED.add(target)
        logger.warning(COMPILED_PASS_NOTE)


def _one_by_one(target: Target, drafter: Drafter | None, ids: list[torch.Tensor], max_new_tokens: int,
                sampling: SamplingConfig, seed: int, arrivals: list[float], trace: bool,
                clock: LoopClock) -> list[GenerationResult]:
    """Batch size 1: each request through ``generate`` itself, in the order of arrival, each once it has arrived."""
    origin, results = clock.now(), {}
    for i in arrival_order(arrivals):
        clock.wait_until(origin + arrivals[i])
        start = clock.now() - origin
        result = generate(target, drafter, ids[i], max_new_tokens, sampling, seed + i, trace=trace)
        m = result.metrics
        first = start + m.calibration_seconds + m.time_to_first_token
        results[i] = replace(result, metrics=replace(m, arrival_s=arrivals[i], first_token_s=first,
                                                     finish_s=clock.now() - origin))
    return [results[i] for i in range(len(ids))]


class _Batch(BatchPlanning, BatchRequests):
    """The loop's state: the batch target, the live requests (slot = position in ``live``), the results; its pass
    here, its planning (:class:`BatchPlanning`) and its admissions and retirements (:class:`BatchRequests`) apart."""

    def __init__(self, target: Target, drafter: Drafter | None, sampling: SamplingConfig, seed: int, budget: int,
                 slots: int, capacity: int, clock: LoopClock, cost_clock: Callable[[], float]) -> None:
        self.target, self.prototype, self.sampling, self.seed, self.budget = target, drafter, sampling, seed, budget
        self.device = target.device  # read once: Target.device walks the model's parameters on every read
        self.batch = BatchTarget(target, slots, capacity)
        self.loop_clock, self.clock = clock, clock.now
        self.cost_clock = cost_clock  # the policy's pass times: CPU time on a one-thread CPU run
        self.origin, self.trace = 0.0, True
        by_load = drafter is not None and isinstance(drafter.policy, AutoPolicy)  # a cost-aware drafter's length
        self.load = LengthPolicy(costs=RowCosts.of(target, drafter), realized=kept_realized(target, drafter)) \
            if by_load else None  # t(B, N) and what drafted passes realized kept across calls
        self.gate = kept_gate(target, drafter) if gated(drafter) else None  # its own lengths, by load (batch_gate)
        self.catch_up = kept_catch_up(target, drafter) if by_load else None  # seconds a token of a backlog costs
        self.hold = VerdictHold()  # a steady pass's verdict to draft nothing, held while nothing it rests on moves
        self.deepest = len(drafter.policy.acceptance()) if by_load else 0  # the levels a slot may draft
        self.waves = WaveLedger()  # this run's last-wave passes (batch_waves): judged at its end
        self.wave_pass: tuple[int, float | None] | None = None  # a steady last-wave pass's start (_wave_before)
        if self.load is not None:
            self.load.joint_only = self._wave_record().waves_closed > 0  # earlier runs' last waves closed it
        self.lookahead: bool | None = None  # propose at full length, then plan on the drafts (learned: _learn)
        self.proposal_seconds: deque[float] = deque(maxlen=5)  # seconds of the latest proposals _learn judged
        self.pooled = kept_tally(target, drafter)  # every request's drafted levels and accepted, kept across calls
        self.evidence = Evidence(kept_evidence(target, drafter))  # copy drafts' acceptance by their match length
        self.live: list[Request] = []
        self.results: dict[int, GenerationResult] = {}
        self.features = drafter is not None and drafter.needs_features
        self.copier = None if drafter is None else SlotCopier(drafter, target)  # a slot's first admission's copy
        self.spare: list[Drafter] = []  # retired requests' drafters, ended: the next admissions' (BatchRequests)
        self.wave: int | None = None  # in the batch's last wave: the requests still waiting (batch_goodput.last_wave)
        self.passes = 0  # target passes so far (the debug log's count: batch_log)

    def run(self, prompts: list[torch.Tensor], arrivals: list[float], trace: bool) -> list[GenerationResult]:
        self.origin, self.trace = self.clock(), trace
        waiting = deque(arrival_order(arrivals))
        try:
            while waiting or self.live:
                while waiting and len(self.live) < self.batch.cache.slots and \
                        arrivals[waiting[0]] <= self.clock() - self.origin and not self._held(waiting, arrivals):
                    index = waiting.popleft()
                    self._admit(index, prompts[index], arrivals[index])
                if not self.live:  # nothing to decode until the next request arrives
                    self.loop_clock.wait_until(self.origin + arrivals[waiting[0]])
                    continue
                self.wave = self._last_wave(waiting, arrivals)
                self._step()  # a newcomer's prompt rides beside the others' roots: no slot waits a pass for it
                self._retire()
            if self.load is not None:
                judge(self.waves, self._wave_record())
        finally:
            for request in self.live:
                if request.own is not None:
                    request.own.end()
        return [self.results[i] for i in range(len(prompts))]

    def _step(self) -> None:
        """One pass over the live slots: propose, one target forward, then verify and commit each request."""
        group = self.live
        prefilled, logged = all(r.prefilled for r in group), batch_log.enabled()
        left = [self.budget - len(r.new_tokens) for r in group] if logged else []  # tokens left, for the debug log
        steady = self.load is not None and prefilled  # no newcomer's prompt in the pass: lengths by load
        planning = self.cost_clock()
        horizon = self._horizon(group) if self.gate is not None and prefilled and self.wave is not None else None
        gammas = self._load_gammas(group) if steady else self._prefill_gammas(group)
        if self.gate is not None:  # lengths of its own: drafted only where they pay (batch_gate)
            gammas = self.gate.lengths(gammas) if prefilled else self._opened(gammas)
        c0 = self.cost_clock()
        proposed, draft_seconds = self._propose(group, gammas)
        drafts = self._plan_drafts(group, gammas, proposed, c0) if steady else proposed
        c1, t1 = self.cost_clock(), self.clock()
        contexts = self.batch.lengths[: len(group)]  # each slot's cached tokens: what its rows attend
        feeds = [SlotFeed(r.pending, d) for r, d in zip(group, drafts, strict=True)]
        outs = self.batch.forward(0, feeds, self.features)
        verdicts = self._verify(group, drafts, outs)
        self.batch.commit_all({slot: accepted for slot, (accepted, _) in enumerate(verdicts)})
        t2, c2 = self.clock(), self.cost_clock()
        rows = self.batch.rows
        roots = torch.tensor([token for _, token in verdicts], dtype=torch.long).to(self.device, non_blocking=True)
        # the tokens of the drafts with accepted nodes: those on the device (medusa's, hydra's trees) in one copy
        taken = to_host([draft.tokens if accepted else None for draft, (accepted, _) in zip(drafts, verdicts,
                                                                                           strict=True)])
        told = [self._commit(request, draft, out, verdict, taken[slot], roots[slot : slot + 1], seconds, t2 - t1, t2)
                for slot, (request, draft, out, seconds, verdict) in enumerate(
                    zip(group, drafts, outs, draft_seconds, verdicts, strict=True))]
        self._observed(group, told)
        if steady:
            c3 = self.cost_clock()
            if all(d.side is None for d in drafts):
                attended = sum(len(d) * c for d, c in zip(drafts, contexts, strict=True))
                catch_up = sum(d.catch_up_seconds for d in proposed)  # a start, not a step (kept across runs)
                self.load.timed(len(group), rows, max(_depth(d) for d in proposed), max(0.0, c1 - c0 - catch_up),
                                c2 - c1, sum(contexts), attended, (c1 - planning) + (c3 - c2), c3 - c2)
                # realized vs. predicted, the pass whole: its plan, proposals, forward and its drafts' commit
                self.load.settle([len(accepted) + 1 for accepted, _ in verdicts], c3 - planning)
            self._wave_passed(group, drafts, c3 - planning)
        if self.gate is not None and prefilled:
            # drafted: any pass that asked for drafts, whatever came back (lookahead's window fed alone while its pool
            # holds no match is what its drafted passes cost too; left out, the gate saw only passes whose pool
            # matched and kept open a drafter that lost under load: docs/batching-log.md, session 31)
            self.gate.record(len(group), any(gammas), self._brought(group, verdicts, horizon),
                             self.cost_clock() - planning)
        self.passes += 1
        if logged:
            lines = batch_log.slot_lines([r.index for r in group], left, drafts, verdicts)
            batch_log.log_pass(self.passes, prefilled, self.wave, self.budget, lines, self.batch.rows, c2 - c0)

    def _verify(self, group: list[Request], drafts: list[Draft], outs: list) -> list[tuple[list[int], int]]:
        """Each request's (accepted nodes, next token): under the exact rule every slot's at once, one host copy a
        pass (``verify_greedy_slots`` at temperature 0; ``verify_sampled_slots`` where the walks run on the device),
        where slot by slot each waited for its own; else by each request's own rule (on the host, a lossy drafter's,
        or under the target's logits processors)."""
        logits = [out.logits for out in outs]
        if all(request.accept is verify_draft for request in group):
            generators = [request.ctx.generator for request in group]
            if self.sampling.greedy:
                return verify_greedy_slots(drafts, logits)
            if all(walks_on_device(rows, generator) for rows, generator in zip(logits, generators, strict=True)):
                return verify_sampled_slots(drafts, logits, self.sampling, generators,
                                            [drafter_name(request.drafter) for request in group])
        return [_verified(request.accept, request.drafter, draft, out.logits, self.sampling, request.ctx.generator)
                for request, draft, out in zip(group, drafts, outs, strict=True)]

    def _brought(self, group: list[Request], verdicts: list, horizon: int | None) -> float:
        """What a pass brought the batch, for the gate: the tokens it committed; in a last wave (``horizon``: the
        batch's projected end before the pass) its end's advance for every slot, as a plain pass brings one token
        each: tokens of slots that only run ahead of the others end the batch no sooner (``batch_waves``; lookahead
        at B=4 opened on its committed tokens and lost 4%, docs/batching-log.md, session 32), as the wave ledger counts
        it (``_advance``)."""
        if horizon is None:
            return float(sum(len(accepted) + 1 for accepted, _ in verdicts))
        return len(group) * self._advance(group, horizon)

    def _opened(self, gammas: list[int]) -> list[int]:
        """A pass that prefills a newcomer: a gated drafter's own lengths where its gate is open at this batch size,
        else none (nothing measures drafts beside a prompt's rows; a lone newcomer's first pass is no exception)."""
        return gammas if self.gate.opens(len(gammas)) else [0] * len(gammas)

    def _wave_record(self) -> Realized:
        """The load's kept record at this batch's slots (``batch_goodput.Realized``: its ``waves_closed``)."""
        return self.load.realized.setdefault(self.batch.cache.slots, Realized())

    def _plan_drafts(self, group: list[Request], gammas: list[int], proposed: list[Draft], c0: float) -> list[Draft]:
        """A steady pass's drafts as planned (``BatchPlanning._planned``), but a lookahead pass whose proposals all
        came back empty (prompt lookup or suffix found no match in any slot) is not valued nor planned: with no
        prospect holding a level its plan is no draft. What ``_planned`` keeps of such a pass is kept (the slots'
        asked counts, the proposal's time for ``_learn``, the length policy's record of a pass that drafted
        nothing)."""
        if not any(gammas):  # nothing asked of any slot: nothing to keep (the plan recorded its idle pass)
            return proposed
        if not self.lookahead or any(len(d) or d.q is not None or d.side is not None for d in proposed):
            return self._planned(group, gammas, proposed, c0)
        for request, gamma in zip(group, gammas, strict=True):
            request.asked += gamma > 0
        self._learn(group, proposed, self.cost_clock() - c0)
        self.load.lengths([Prospect((), ())] * len(group))
        return proposed

    def _propose(self, group: list[Request], gammas: list[int]) -> tuple[list[Draft], list[float]]:
        """The drafts and each one's share of the proposal time."""
        if self.prototype is None or not any(gammas):
            return [Draft.empty()] * len(group), [0.0] * len(group)  # one for all: a fresh one validates its tensors
        t0 = self.clock()
        drafts = propose_batch(self.prototype, [r.drafter for r in group], [r.ctx for r in group], gammas)
        share = (self.clock() - t0) / len(group)
        if self.catch_up is not None:  # the plans that price a backlog (BatchPlanning._start)
            self._caught_up(group, gammas, drafts)
        return drafts, [share if gamma else 0.0 for gamma in gammas]

    def _caught_up(self, group: list[Request], gammas: list[int], drafts: list[Draft]) -> None:
        """The slots asked for tokens caught their drafters up: their backlogs and catch-up seconds measured
        (``batch_catchup``), their backlogs cleared."""
        tokens, seconds = 0, 0.0
        for request, gamma, draft in zip(group, gammas, drafts, strict=True):
            if gamma:
                tokens += len(request.ctx.tokens) - request.synced
                seconds += draft.catch_up_seconds
                request.synced = len(request.ctx.tokens)
        self.catch_up.observe(tokens, seconds)

    def _observed(self, group: list[Request], told: list[VerifyOutcome | None]) -> None:
        """Every slot's drafter that goes on told its outcome, in one call (``batch_slots.observe_batch``)."""
        going = [(request.drafter, outcome) for request, outcome in zip(group, told, strict=True)
                 if outcome is not None]
        if going:
            observe_batch(self.prototype, [drafter for drafter, _ in going], [outcome for _, outcome in going])

    def _commit(self, request: Request, draft: Draft, out, verdict: tuple[list[int], int], taken: torch.Tensor | None,
                root: torch.Tensor, draft_seconds: float, verify_seconds: float, end: float) -> VerifyOutcome | None:
        """Record the pass for ``request``, append its new tokens, report to its drafter's policy; the outcome its
        drafter observes (None: the request is done, or has no drafter). ``verdict``: (accepted nodes, next token);
        ``taken``: the draft's tokens on the host where it has accepted nodes; ``root``: the next token on the
        target's device (every slot's made in one copy), its root in the next pass."""
        accepted, next_token = verdict
        depth = _depth(draft)
        verified = draft.verified_depth(accepted) if depth else 0
        request.recorder.record_pass(depth, len(accepted), draft_seconds, verify_seconds, proposed_tokens=len(draft),
                                     catch_up_seconds=draft.catch_up_seconds, verified_depth=verified)
        if verified:
            request.tally.add(verified, len(accepted))
            self.pooled.add(verified, len(accepted))
        committed = [*_tokens_at(taken, accepted), next_token]
        kept, finished = truncate(committed, self.budget - len(request.new_tokens), self.target.eos_token_ids)
        request.tracer.record(draft.tokens, draft.parents, accepted, next_token, len(kept), draft_seconds,
                              verify_seconds, end)
        request.new_tokens += kept
        request.ctx.tokens += kept
        m, start = request.pending.numel(), request.ctx.target.cached_length - len(accepted) - request.pending.numel()
        request.prefilled = True
        if finished or self.budget == 0:
            request.done = True
            return None
        request.pending = root
        if request.drafter is None:
            return None
        # asked (its share of the proposal timed: draft_seconds > 0) and empty: that share is its c, as at batch 1
        _report(request.drafter.policy, draft, depth, accepted, draft_seconds, verify_seconds, draft_seconds > 0)
        return _outcome(draft, accepted, committed, out.features, m, start, out.logits)

