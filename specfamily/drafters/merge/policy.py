"""Per-part draft lengths for the merge drafter: each part drafts what its own policy says pays.

One cost-aware policy for the merged draft sees the sum of its parts' costs: merged with eagle3, suffix's nearly free
drafts were cut along with eagle3's dear ones. :class:`PartsPolicy` stands in for the merged draft's policy (the one
the loop asks) and asks each part's own policy instead: before a pass, every part's policy gives its draft length
(0: that part contributes nothing this pass); the merged draft is as deep as the deepest of them. After the pass,
each part's policy hears what that part alone would have been told (:func:`part_report`): its own depth, tree size,
accepted path and tried levels, and its share of the pass's measured draft time. With ``credit="marginal"`` (the
default) a part after the first is credited only the tokens its path accepted beyond the longest path of the parts
before it (what it added to the merge, not what it would have had alone), and its depths beyond that as rejected:
a later part whose accepted tokens the earlier parts' trees already held is not paid for them again. The
verification pass's cost curve and measured pass times are the target's, told to every part's policy as they are.

The decision is made before any part draws, from what earlier passes showed, so a part's drafting never depends on
this pass's draws: the merged tree stays exact (:mod:`specfamily.core.tree_merge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specfamily.core.policy import AutoPolicy
from specfamily.core.policy_protocol import Policy, policy_hooks
from specfamily.core.theory import VerifyCost
from specfamily.core.types import Draft
from specfamily.drafters.merge.config import CREDITS


@dataclass(frozen=True)
class PartPass:
    """What one part did in a pass: its draft and the seconds its ``propose`` took (0 and empty when not asked), and
    whether it was asked for a draft (one asked that came back empty reports its proposal's time)."""

    draft: Draft
    seconds: float = 0.0
    asked: bool = False


@dataclass(frozen=True)
class PartReport:
    """One part's ``Policy.update`` arguments for a pass (as if it had drafted alone)."""

    proposed: int
    accepted: int
    c: float | None
    tokens: int
    verified: int
    overhead: float | None


def _depth(draft: Draft) -> int:
    if len(draft) == 0:
        return 0
    return len(draft) if draft.is_chain else int(draft.depths().max())


def part_report(own: PartPass, path: list[int], shares: tuple[float, float], pass_c: float | None,
                pass_overhead: float | None, cost_ratio: float, credited: int | None = None) -> PartReport:
    """The part's report: ``path`` its own accepted nodes; ``shares`` its share of the pass's own draft time and of
    its catch-up; ``pass_c`` the merged draft's c (draft seconds over the verification's, per merged depth, times
    that depth: see :meth:`PartsPolicy.update`); ``cost_ratio`` t(merged size + 1) / t(part size + 1), which turns
    a c measured against the merged pass into one against a pass of the part's own size (what its policy assumes).
    ``credited``: the accepted tokens to report instead of ``len(path)`` (its depth after them counted as tried
    and rejected); None: its own path's. A part asked for a draft that came back empty reports its share of the
    draft time as c, as the loop reports an empty draft it asked for (``core.loop._report``)."""
    proposed = _depth(own.draft)
    c = overhead = None
    if proposed and pass_c is not None:
        c = pass_c * shares[0] / proposed * cost_ratio
    elif own.asked and pass_c is not None:
        c = pass_c * shares[0] * cost_ratio
    if proposed and pass_overhead is not None:
        overhead = pass_overhead * shares[1] * cost_ratio
    verified = own.draft.verified_depth(path) if proposed else 0
    accepted = len(path)
    if credited is not None and proposed:
        accepted, verified = credited, min(verified, credited + 1)
    return PartReport(proposed, accepted, c, len(own.draft), verified, overhead)


def shares(passes: Sequence[PartPass]) -> list[tuple[float, float]]:
    """Each part's share of the pass's draft time (its own time, catch-up left out) and of its catch-up."""
    own = [max(0.0, p.seconds - p.draft.catch_up_seconds) for p in passes]
    catch = [p.draft.catch_up_seconds for p in passes]
    total_own, total_catch = sum(own), sum(catch)
    return [(o / total_own if total_own > 0 else 0.0, k / total_catch if total_catch > 0 else 0.0)
            for o, k in zip(own, catch, strict=True)]


@dataclass
class PartsPolicy:
    """The merged draft's policy when it has no gamma of its own: the parts' policies decide, each for its part.

    ``policies``: each part's own policy; ``caps``: the most each part drafts (None: no cap); ``credit``: what a
    part's policy is told it got accepted, its ``"marginal"`` tokens (beyond the earlier parts' paths) or its
    ``"own"`` path's (as if it had drafted alone). A part credited its marginal tokens after the first starts each
    request from the fixed prior, not from its earlier requests (``AutoPolicy.run_window`` 0): what it adds depends
    on how much the parts before it covered in each request, no property of its own to carry (merged with suffix,
    eagle3's marginal history said its drafts no longer paid and merge fell from 1.36x to 1.26x plain at batch 1,
    docs/policy-costs.md). ``next_gamma`` leaves the parts' lengths in ``planned`` for the drafter's ``propose``;
    ``update`` keeps the merged pass's c and overhead until the drafter reports each part (:meth:`report_parts`)."""

    policies: list[Policy]
    caps: list[int | None]
    names: list[str]
    verify_cost: VerifyCost = None
    credit: str = "marginal"
    planned: list[int] | None = field(default=None, init=False)
    _pass: tuple[int, float | None, float | None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.credit not in CREDITS:
            raise ValueError(f"merge credit must be one of {', '.join(CREDITS)}, got {self.credit!r}")
        if self.credit == "marginal":
            for policy in self.policies[1:]:
                if isinstance(policy, AutoPolicy):
                    policy.run_window = 0  # the class docstring says why

    def bind(self, verify_cost: VerifyCost) -> None:
        """The target's verify-cost curve, for every part's policy that wants one."""
        self.verify_cost = verify_cost
        for policy in self.policies:
            bind = policy_hooks(policy).bind
            if bind is not None:
                bind(verify_cost)

    def timed(self, tokens: int, seconds: float) -> None:
        """A pass of the target: a fact about its cost every part's policy may use."""
        for policy in self.policies:
            policy_hooks(policy).timed(tokens, seconds)

    def resume(self, previous: object) -> bool:
        """Continue each part's policy from ``previous``'s for the same part (a fresh merge drafter on a target where
        one of its class ran: ``core.policy_kept``), through the part policy's own ``resume`` where it has one; only
        from a PartsPolicy of the same parts, caps and credit. Returns whether any part resumed."""
        if previous is self or not isinstance(previous, PartsPolicy) or \
                (previous.names, previous.caps, previous.credit) != (self.names, self.caps, self.credit):
            return False
        resumed = False
        for mine, theirs in zip(self.policies, previous.policies, strict=True):
            resume = getattr(mine, "resume", None)
            resumed = (callable(resume) and bool(resume(theirs))) or resumed
        return resumed

    def reset(self) -> None:
        """Nothing of its own: each part's ``begin`` resets its policy."""
        self.planned, self._pass = None, None

    def next_gamma(self) -> int:
        self.planned = [policy.next_gamma() if cap is None else min(policy.next_gamma(), cap)
                        for policy, cap in zip(self.policies, self.caps, strict=True)]
        return max(self.planned, default=0)

    def take(self) -> list[int] | None:
        """The parts' planned lengths for this pass, once."""
        planned, self.planned = self.planned, None
        return planned

    def update(self, proposed: int, accepted: int, c: float | None = None, tokens: int | None = None,
               verified: int | None = None, overhead: float | None = None) -> None:
        """The merged pass: kept (as draft time over the verification's: c times the merged depth, or c itself for an
        empty draft the loop asked for) for the parts."""
        if proposed or c is not None:
            self._pass = (tokens or proposed, None if c is None else c * max(proposed, 1), overhead)
        else:
            self._pass = None

    def report_parts(self, passes: Sequence[PartPass], paths: Sequence[list[int]]) -> None:
        """Each part's policy hears its own part of the last merged pass."""
        measured, self._pass = self._pass, None
        if measured is None:
            return
        size, pass_c, pass_overhead = measured
        reached = 0  # the longest path the parts before this one had accepted
        for policy, own, path, share in zip(self.policies, passes, paths, shares(passes), strict=True):
            ratio = self._cost(size) / self._cost(len(own.draft))
            credited = max(0, len(path) - reached) if self.credit == "marginal" else None
            r = part_report(own, path, share, pass_c, pass_overhead, ratio, credited)
            policy.update(r.proposed, r.accepted, r.c, tokens=r.tokens, verified=r.verified, overhead=r.overhead)
            reached = max(reached, len(path))

    def _cost(self, tokens: int) -> float:
        cost = self.verify_cost
        return 1.0 if cost is None else float(cost(tokens) if callable(cost) else cost)

    def describe(self) -> str:
        """Each part's policy's own account."""
        return "; ".join(f"{name}: {policy_hooks(policy).describe() or type(policy).__name__}"
                         for name, policy in zip(self.names, self.policies, strict=True))
