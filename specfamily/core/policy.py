"""Draft-length policies: how many tokens (tree depth for tree drafters) to propose next.

The loop asks ``next_gamma()`` before each proposal and reports each verification with
``update(proposed, accepted, c, tokens)``: the depth of the draft just verified, how many draft tokens
were accepted, the running measured cost ratio c (None while unknown) and the draft's size. ``reset()``
starts a new request. ``auto`` (the default when no gamma is given) may answer 0: draft nothing. The protocol and
its optional hooks are :mod:`specfamily.core.policy_protocol`'s.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields
from typing import Any

from specfamily.core.costs import MeasuredCost
from specfamily.core.policy_protocol import Policy
from specfamily.core.schedules import ConstantPolicy, HeuristicPolicy, OptimalPolicy, check_update
from specfamily.core.theory import VerifyCost, best_draft_length, check_int


@dataclass
class AutoPolicy:
    """Cost-aware draft length: the gamma (0: draft nothing) with the best expected speedup at the running
    per-depth acceptance, the running c and the target's measured verify-cost curve (``theory.best_draft_length``).

    Acceptance is counted per depth, as the verifier tried them: depth d is tried when the accepted path reached
    d - 1 and its last node has children there (``verified``; a chain: every shallower token accepted). Each depth
    is smoothed towards the one above it with ``prior_weight`` pseudo-observations, so a deeper draft is predicted
    from what was measured, not from an i.i.d. assumption; depth 1 towards the earlier requests' depth-1 acceptance
    (``earlier_alpha``: their latest ``run_window`` tries, smoothed towards ``prior_alpha``), so a request's start
    begins from what the drafter has done, not from a fixed guess that counts down-weighted at every request fall
    back to (a drafter that never paid drafted again at each request's start: docs/policy-costs.md). c is one draft
    step's time over one one-token target pass, each pass's own ratio converted with that pass's own size; a drafter's
    per-pass ``overhead`` (feeding what it had not seen, measured only on a pass that follows a drafted pass, so an
    idle stretch's backlog is not counted) is added to each drafted pass's cost, and so is ``empty``, the time of
    the drafts asked for between two drafted passes that came back empty (a lookup that matched nothing). A probe's
    c replaces the estimate (the newest evidence about a cost that made it idle: one dear cold start must not
    silence a run), and so does the second drafted pass's c the first's (a fresh drafter's first forward is cold:
    eagle's head measured c 0.5-0.6 on it, 0.08 after).
    ``bind(verify_cost)`` gives it t(g + 1) / t(1); until c is known it drafts ``gamma``. It drafts only when the
    predicted speedup beats ``min_speedup`` (a noise margin); while it drafts nothing it still probes (at the best
    length, or at ``gamma`` when none predicts a gain: a one-token probe never learns how deep drafts are accepted),
    first after ``probe_every`` passes, then at doubling intervals up to ``max_probe_every``. The schedule counts the
    passes of the whole run (a drafter object serves many requests): ``reset`` keeps it. An interval doubles after a
    probe was verified and lost, and after a stretch of drafted passes that lost (its accepted tokens plus one a pass
    fewer than its cost in plain passes: each pass's verification as timed, else as costed, plus its own draft steps
    and catch-up, an idle stretch's backlog included): a probe that makes the estimates look good for a few losing
    passes counts as a losing probe. It doubles only when the loss exceeds what probing at that interval may cost,
    ``min_speedup - 1`` plain passes a pass (cheap chain probes keep their interval: a long losing start must not
    silence a run whose drafts pay later), and goes back to ``probe_every`` after a stretch or probe that paid. A
    tree's probe when no length predicts a gain is the deepest draft, up to ``gamma``, whose verification costs at
    most ``probe_cost`` plain passes (at least depth 1): a full tree as a probe costs more than the gain it could
    find; a chain's, the deepest whose draft steps fit in the margin probing at the interval may lose. Estimates
    carry over to the next request, down-weighted to ``memory`` of their counts. A request's first drafted pass's
    catch-up (a draft model's prompt prefill) is measured as ``start_cost`` and, until a request drafts, spread over
    the passes it has left (requests as long as the ones before) on top of ``overhead``. ``max_gamma`` caps the
    draft length (tree drafters cap it at their calibrated depth).

    Costs are the run's own: it plans and converts with the bound curve times what ``timed`` passes measured of it
    (:class:`~specfamily.core.costs.MeasuredCost`), and once passes are timed it makes a plain pass whenever
    ``refresh_every`` drafted passes went by without one, to measure the plain pass at the cache lengths reached.
    """

    gamma: int
    max_gamma: int = 16
    verify_cost: VerifyCost = None
    prior_alpha: float = 0.6
    prior_weight: float = 2.0
    min_speedup: float = 1.02
    probe_every: int = 16
    max_probe_every: int = 256
    memory: float = 0.5
    c_smoothing: float = 0.3
    refresh_every: int = 32
    probe_cost: float = 1.5
    run_window: float = 64.0
    tried: list[float] = field(init=False, repr=False)
    accepted: list[float] = field(init=False, repr=False)
    earlier: list[float] = field(init=False, default_factory=lambda: [0.0, 0.0], repr=False)  # depth 1's tries
    # and acceptances in the earlier requests (the latest ``run_window`` tries)
    _began: list[float] = field(init=False, default_factory=lambda: [0.0, 0.0], repr=False)  # depth 1's counts
    # at this request's start (what they gained since is its own, folded into ``earlier`` at its end)
    c_estimate: float | None = field(init=False, default=None)
    overhead: float = field(init=False, default=0.0)  # per drafted pass, in one-token target passes
    empty: float = field(init=False, default=0.0)  # per drafted pass: the empty drafts asked beside it, in passes
    start_cost: float = field(init=False, default=0.0)  # a request's first drafted pass's catch-up, in passes
    request_passes: float = field(init=False, default=0.0)  # passes a request takes (smoothed; 0: none ended)
    started: bool = field(init=False, default=False)  # this request's drafter paid its start (a drafted pass)
    request_pass: int = field(init=False, default=0)  # passes asked in this request
    width: float = field(init=False, default=1.0)  # draft tokens per depth (1 for chains)
    idle: int = field(init=False, default=0)  # passes since the last draft, across requests
    interval: int = field(init=False, default=0)  # passes between probes while drafting nothing
    passes: int = field(init=False, default=0)  # passes asked about, and of those
    drafted: int = field(init=False, default=0)  # the ones given a draft length > 0
    costs: MeasuredCost = field(init=False, repr=False)  # what the run's passes measured
    _probing: bool = field(init=False, default=False, repr=False)
    _stretch: list[float] = field(init=False, default_factory=lambda: [0.0, 0.0, 0.0], repr=False)  # tokens,
    # cost, the interval when it began
    _empties: float = field(init=False, default=0.0, repr=False)  # empty drafts' time since the last drafted pass
    _cold: bool = field(init=False, default=False, repr=False)  # the running stretch began before c was known
    _first_c: bool = field(init=False, default=False, repr=False)  # c is the drafter's first drafted pass's alone
    _steady: bool = field(init=False, default=False, repr=False)  # the latest pass verified a draft: no backlog
    _timed: tuple[int, float] | None = field(init=False, default=None, repr=False)  # the latest drafted pass's time
    _choice: tuple[int, int, float] | None = field(init=False, default=None, repr=False)  # (best, probe, speedup)

    def __post_init__(self) -> None:
        self.gamma = check_int(self.gamma, "gamma", 1)
        self.max_gamma = check_int(self.max_gamma, "max_gamma", 1)
        self.probe_every = check_int(self.probe_every, "probe_every", 1)
        self.max_probe_every = check_int(self.max_probe_every, "max_probe_every", self.probe_every)
        self.refresh_every = check_int(self.refresh_every, "refresh_every", 1)
        self.interval = self.probe_every
        self.costs = MeasuredCost()
        for name in ("prior_alpha", "memory", "c_smoothing"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if not (math.isfinite(self.probe_cost) and self.probe_cost >= 1.0):
            raise ValueError(f"probe_cost must be a finite number >= 1, got {self.probe_cost!r}")
        if not (math.isfinite(self.run_window) and self.run_window >= 0):
            raise ValueError(f"run_window must be a finite number >= 0, got {self.run_window!r}")
        if not (math.isfinite(self.prior_weight) and self.prior_weight > 0):
            raise ValueError(f"prior_weight must be a finite number > 0, got {self.prior_weight!r}")
        self.tried, self.accepted = [0.0] * self.max_gamma, [0.0] * self.max_gamma

    def bind(self, verify_cost: VerifyCost) -> None:
        """Use this verify-cost curve (t(g + 1) / t(1), a callable of the draft token count g)."""
        self.verify_cost = verify_cost
        self._choice = None

    def acceptance(self) -> list[float]:
        """Smoothed conditional acceptance at depths 1 .. max_gamma."""
        out, prior = [], self.earlier_alpha()
        for tried, accepted in zip(self.tried, self.accepted, strict=True):
            prior = (accepted + prior * self.prior_weight) / (tried + self.prior_weight)
            out.append(prior)
        return out

    def earlier_alpha(self) -> float:
        """What depth 1's estimate is smoothed towards: the earlier requests' depth-1 acceptance (their latest
        ``run_window`` tries; none when it is 0), itself smoothed towards ``prior_alpha``."""
        tried, accepted = self.earlier
        return (accepted + self.prior_alpha * self.prior_weight) / (tried + self.prior_weight)

    def _cost(self, gamma: int) -> float:
        """Verify cost of a draft of depth gamma, at the running width (tokens per depth)."""
        return self._cost_of(gamma * self.width)

    def _cost_of(self, tokens: float) -> float:
        """t(tokens + 1) / t(1): the bound curve times what the run's own passes measured of it."""
        return self._prior(tokens) * self.costs.scale(tokens)

    def _prior(self, tokens: float) -> float:
        cost = self.verify_cost
        return 1.0 if cost is None else float(cost(tokens) if callable(cost) else cost)

    def timed(self, tokens: int, seconds: float) -> None:
        """One pass the run made (``tokens`` draft tokens, 0: plain) took ``seconds``: corrects its costs. The kept
        choice is planned again only when what it reads changed (the measured scale's points): a plain pass moves
        t(1) alone, which no choice reads, so an idle policy does not plan again after every pass. A probe's pass
        replaces what was measured at its size, as its c replaces the estimate: the newest evidence about a cost that
        made the policy idle."""
        tokens = check_int(tokens, "tokens", 0)
        self._timed = (tokens, seconds) if tokens else None
        points = self.costs.points
        self.costs.observe(tokens, seconds, self._prior(tokens), fresh=self._probing)
        if self.costs.points is not points:
            self._choice = None

    def resume(self, previous: AutoPolicy) -> bool:
        """Continue from ``previous``, an earlier policy of the same drafter class on the same target (the loop's
        ``core.policy_kept``), as that one would start its next request: its costs, acceptance counts, start cost and
        probe schedule, copied (its own pass counts, which ``describe`` reports, are not). Only a policy that has not
        been asked for a length yet resumes, and only from one of the same settings; returns whether it did."""
        if self.passes or not isinstance(previous, AutoPolicy) or previous is self:
            return False
        if any(getattr(self, f.name) != getattr(previous, f.name) for f in fields(self)
               if f.init and f.name != "verify_cost"):
            return False
        for f in fields(self):
            if not f.init and f.name not in ("passes", "drafted", "_choice"):
                setattr(self, f.name, copy.deepcopy(getattr(previous, f.name)))
        if self.verify_cost is None:
            self.verify_cost = previous.verify_cost
        self._choice = None
        return True

    def reset(self) -> None:
        """A new request: the counts are down-weighted to ``memory`` of them (acceptance differs between requests;
        docs/policy-costs.md, session 24, measured keeping short requests' counts whole: it did worse)."""
        tried = self.earlier[0] + self.tried[0] - self._began[0]
        accepted = self.earlier[1] + self.accepted[0] - self._began[1]
        keep = min(1.0, self.run_window / tried) if tried else 0.0
        self.earlier = [tried * keep, accepted * keep]
        self.tried = [n * self.memory for n in self.tried]
        self.accepted = [n * self.memory for n in self.accepted]
        self._began = [self.tried[0], self.accepted[0]]
        if self.request_pass:
            self.request_passes = self._smooth(self.request_passes or None, float(self.request_pass))
        self._steady, self.started, self.request_pass, self._choice = False, False, 0, None

    def next_gamma(self) -> int:
        self.passes += 1
        self.request_pass += 1
        if not self.started and self.start_cost and self._choice is not None and self._choice[0]:
            self._choice = None  # the start's share grows as the request's remaining passes shrink (_unstarted)
        gamma = self._next()
        self.drafted += gamma > 0
        return gamma

    def _next(self) -> int:
        if self.c_estimate is None:
            return min(self.gamma, self.max_gamma)
        if self.costs.refresh_due(self.refresh_every):
            return 0
        gamma, probe, _ = self._choose()
        if gamma:
            self.idle, self._probing = 0, False
            return gamma
        if self.idle + 1 < self.interval:
            self.idle += 1
            return 0
        self._probing = True  # until a probe is verified: one cut to 0 at a request's end is asked again
        probe = self._unstarted() or probe
        return probe or self._probe_depth()  # at the interval reached: it may change while the choice is kept

    def _unstarted(self) -> int:
        """The probe length planned again at this pass's start share, while the request has not drafted (0 when it
        has, or has no start cost). A kept choice that drafts nothing is not planned again on idle passes: a larger
        share only lowers every length's predicted speedup, so it stays nothing; replanning it on every pass of a
        request that never drafts was most of a non-drafting drafter's idle cost (docs/policy-costs.md)."""
        if self.started or not self.start_cost:
            return 0
        self._choice = None
        return self._choose()[1]

    def _choose(self) -> tuple[int, int, float]:
        """(the draft length to use, 0 when none pays; the one to probe with, 0: ``_probe_depth``'s; its predicted
        speedup), kept until the estimates change: while it drafts nothing a pass costs no arithmetic."""
        if self._choice is None:
            self._choice = self._planned()
        return self._choice

    def _planned(self) -> tuple[int, int, float]:
        """:meth:`_choose`'s plan on the current estimates and start share, computed afresh, kept nowhere."""
        acceptance, overhead = self.acceptance(), self.overhead + self.empty + self._start_share()
        gamma, speedup = best_draft_length(acceptance, self.c_estimate, self._cost, self.min_speedup, overhead)
        best = best_draft_length(acceptance, self.c_estimate, self._cost, 0.0, overhead)
        return gamma, gamma or best[0], speedup if gamma else best[1]

    def _start_share(self) -> float:
        """Until this request drafted: its start (the drafter's catch-up over the prompt and all it skipped, as the
        requests before measured it) spread over the passes the request has left (as long as requests ran)."""
        if self.started or not self.request_passes:
            return 0.0
        return self.start_cost / max(1.0, self.request_passes - self.request_pass + 1)

    def _probe_depth(self) -> int:
        """The probe when no length predicts a gain: for a tree (more than one token a depth) the deepest up to
        ``gamma`` whose verification costs at most ``probe_cost`` plain passes; for a chain the deepest up to
        ``gamma`` whose draft steps (c a step) cost at most the margin probing at this interval may lose,
        ``min_speedup - 1`` plain passes a pass (a model-free chain's steps are nearly free: its deep probes are what
        found prompt lookup's deep acceptance, docs/policy-costs.md; a draft model's are not); at least 1."""
        depth = min(self.gamma, self.max_gamma)
        margin = (self.min_speedup - 1.0) * self.interval
        while depth > 1 and (self._cost(depth) > self.probe_cost if self.width > 1.0 else
                             depth * (self.c_estimate or 0.0) > margin):
            depth -= 1
        return depth

    def update(self, proposed: int, accepted: int, c: float | None = None, tokens: int | None = None,
               verified: int | None = None, overhead: float | None = None) -> None:
        """One verification. ``c``: this pass's draft-step time over its own verification time (catch-up left out;
        for an empty draft the drafter was asked for, its proposal's time, charged to the running stretch: a probe
        answered with nothing ends there and the next waits an interval, and while it drafts, the empty drafts' time
        between two drafted passes joins ``empty``, a cost of each drafted pass like ``overhead``: a retrieval
        drafter's lookups that found nothing cost it a few percent at batch 1 and were counted nowhere,
        docs/policy-costs.md);
        ``verified``: the levels the verifier tried (None: a chain's ``min(proposed, accepted + 1)``);
        ``overhead``: this pass's catch-up time over its verification time (None: not measured)."""
        proposed, accepted = check_update(proposed, accepted)
        if proposed == 0:
            self._steady = False
            if c is not None and math.isfinite(c) and c >= 0:  # asked, and answered with nothing
                if not self._probing:
                    self._empties += c  # a cost of the next drafted pass
                self._account(1.0, 1.0 + c)  # a probe ends here
            return
        self._choice = None
        tokens = tokens or proposed
        levels = min(proposed, accepted + 1) if verified is None else max(accepted, min(verified, proposed))
        for depth in range(min(levels, self.max_gamma)):
            self.tried[depth] += 1
            self.accepted[depth] += int(depth < accepted)
        self.width += self.c_smoothing * (tokens / proposed - self.width)
        pass_cost = self._cost_of(tokens)  # this pass's verification, in one-token passes
        cold = self.c_estimate is None  # a pass of the start gamma, drafted before any decision
        if c is not None and math.isfinite(c) and c >= 0:  # a probe's c replaces the estimate that made it idle,
            fresh = self._probing or self._first_c  # the second pass's the first's (a fresh drafter's cold forward)
            self.c_estimate = c * pass_cost if fresh else self._smooth(self.c_estimate, c * pass_cost)
            self._first_c = cold
        steady, self._steady = self._steady, True
        measured = overhead is not None and math.isfinite(overhead) and overhead >= 0
        if not self.started and measured:
            self.start_cost = self._smooth(self.start_cost or None, overhead * pass_cost)
        self.started = True
        self.empty, self._empties = self._smooth(self.empty, self._empties), 0.0
        if steady and measured:
            self.overhead = self._smooth(self.overhead, overhead * pass_cost)
        self._account(accepted + 1, self._spent(proposed, tokens, pass_cost, c, overhead), cold)

    def _spent(self, proposed: int, tokens: int, pass_cost: float, c: float | None, overhead: float | None) -> float:
        """What the drafted pass just verified cost, in plain passes: its verification as timed (``timed``, over the
        plain pass) or else as costed, plus its own draft steps and catch-up (its ``c`` and ``overhead`` ratios, or
        the estimates when it brought none)."""
        timed, self._timed = self._timed, None
        plain = self.costs.plain_seconds
        verify = timed[1] / plain if timed is not None and timed[0] == tokens and plain else pass_cost
        steps = c if c is not None and math.isfinite(c) and c >= 0 else (self.c_estimate or 0.0) / pass_cost
        extra = overhead if overhead is not None and math.isfinite(overhead) and overhead >= 0 else None
        return verify * (1 + proposed * steps) + (self.overhead if extra is None else verify * extra)

    def _account(self, tokens: float, cost: float, cold: bool = False) -> None:
        """One drafted pass gave ``tokens`` for ``cost`` plain passes: add it to the running stretch of drafted
        passes; when the stretch ends (the policy now drafts nothing) double the probe interval it began at if it
        lost, or if it was a lone probe; while it pays, probe every ``probe_every`` passes again. A stretch that began
        before c was measured (``cold``: the start gamma, drafted by no decision) leaves the interval as it is."""
        if not self._stretch[1]:
            self._stretch[2] = self.interval  # the interval the stretch began at
        self._stretch[0] += tokens
        self._stretch[1] += cost
        pays = self._stretch[0] >= self._stretch[1]
        probing, self._probing = self._probing, False
        if probing:
            self.idle = 0
        if self.c_estimate is None:
            return  # it drafts its start gamma until c is measured: no decision to judge yet
        self._cold = self._cold or cold
        if self._choose()[0]:
            if pays:
                self.interval = self.probe_every
            return
        if pays and (probing or not self._cold):
            self.interval = self.probe_every
        elif probing or not self._cold:  # it lost: back off only when it lost more than the margin allows
            doubled = min(2 * int(self._stretch[2]), self.max_probe_every)
            self.interval = doubled if self._lost_beyond_margin() else int(self._stretch[2])
        self._stretch, self._cold = [0.0, 0.0, 0.0], False

    def _lost_beyond_margin(self) -> bool:
        """Whether the stretch that just ended lost more plain passes than probing at the interval it began at may
        cost: ``min_speedup - 1`` a pass, the margin a predicted gain must beat (a one-token chain probe that loses
        a few hundredths of a pass leaves the interval as it is; a dear probe doubles it until it fits). A loss
        counts in full when no acceptance could pay at the running costs (every depth accepted still predicts no
        gain: the probes then only re-measure c, as rarely as before)."""
        tokens, cost, interval = self._stretch
        if not best_draft_length([1.0] * self.max_gamma, self.c_estimate, self._cost, self.min_speedup,
                                 self.overhead + self.empty)[0]:
            return cost > tokens
        return cost - tokens > (self.min_speedup - 1.0) * interval

    def _smooth(self, previous: float | None, value: float) -> float:
        return value if previous is None else previous + self.c_smoothing * (value - previous)

    def describe(self) -> str:
        """Why it drafts what it drafts, for results and reports."""
        share = self.drafted / self.passes if self.passes else 0.0
        if self.c_estimate is None:
            return f"drafted in {share:.0%} of passes; c not measured yet"
        unstarted = not self.started and self.start_cost  # at the start share the request has reached, kept as is
        gamma, probe, speedup = self._planned() if unstarted else self._choose()
        alpha = self.acceptance()[0]
        verdict = (f"predicted speedup {speedup:.2f} at gamma {gamma}" if gamma else
                   f"predicted gain below {self.min_speedup:g} (best {speedup:.2f})")
        return (f"drafted in {share:.0%} of passes; {verdict} at alpha {alpha:.2f}, c {self.c_estimate:.2f}, "
                f"overhead {self.overhead:.2f}, empty drafts {self.empty:.2f}, start {self.start_cost:.2f}; "
                f"probes every {self.interval} idle passes; "
                f"{self.costs.describe((gamma or probe or self._probe_depth()) * self.width, self._prior)}")


POLICIES: dict[str, type] = {
    "constant": ConstantPolicy, "heuristic": HeuristicPolicy, "optimal": OptimalPolicy, "auto": AutoPolicy,
}


def make_policy(name: str, gamma: int, **options: Any) -> Policy:
    """Build a policy by name: "constant", "heuristic", "optimal" or "auto"; ``gamma`` is the start value."""
    if name not in POLICIES:
        raise ValueError(f"unknown draft-length policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    gamma = check_int(gamma, "gamma", 1)
    cls = POLICIES[name]
    known = {f.name for f in cls.__dataclass_fields__.values() if f.init} - {"gamma"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for policy {name!r}; known: {sorted(known) or 'none'}")
    return cls(gamma, **options)
