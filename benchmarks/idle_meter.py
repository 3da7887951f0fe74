"""The instruments of ``idle_cost.py``: CPU time of the calls a drafter adds to the decode loop, each pass's start,
the policy's kind of each pass, and the idle arm's declining policy.

Wrappers are set on instances (a drafter's ``begin`` / ``observe`` / ``end``, its policy's ``next_gamma`` /
``timed`` / ``update``) and on three of the loop's module functions (``_propose``: each pass's start, in every arm;
``_outcome`` and ``_report``), which the loop looks up at call time. A wrapped call costs two clock reads more
(``Meter.overhead`` measures it).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from specfamily.core import loop
from specfamily.core.policy import AutoPolicy

NEVER_PAYS_C = 1e3  # the idle arm's c estimate: one draft step costs a thousand target passes, so no length pays


@dataclass
class RunLog:
    """One request: CPU time at each pass's start, the policy's kind of each pass, (draft tokens, accepted) of each
    reported pass, CPU seconds per part, the request's end."""

    starts: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    reported: dict[int, tuple[int, int]] = field(default_factory=dict)
    spent: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    end: float = math.nan


class Meter:
    """Collects a :class:`RunLog` per request from the wrapped calls."""

    PARTS = ("begin", "policy", "observe", "outcome", "end")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.log = RunLog()

    def start(self) -> None:
        self.log = RunLog()

    def stop(self, end: float) -> RunLog:
        self.log.end = end
        return self.log

    def timed(self, part: str, fn: Callable) -> Callable:
        """``fn`` with its CPU time added to the running log's ``part``."""
        clock = self.clock

        def call(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.log.spent[part] += clock() - start

        return call

    def overhead(self, calls: int = 20000) -> float:
        """Seconds a wrapped call costs over a bare one (a no-op, ``calls`` of each)."""
        def bare() -> None:
            return None

        wrapped = self.timed("overhead", bare)
        start = self.clock()
        for _ in range(calls):
            bare()
        middle = self.clock()
        for _ in range(calls):
            wrapped()
        end = self.clock()
        self.log = RunLog()
        return ((end - middle) - (middle - start)) / calls


def instrument_loop(meter: Meter) -> None:
    """Wrap the loop's ``_propose`` (each pass's start, in every arm), ``_outcome`` and ``_report``; once per
    process."""
    propose, outcome, report = loop._propose, loop._outcome, loop._report

    def pass_start(*args, **kwargs):
        meter.log.starts.append(meter.clock())
        return propose(*args, **kwargs)

    loop._propose = pass_start
    loop._outcome = meter.timed("outcome", outcome)
    loop._report = meter.timed("policy", report)


def instrument(meter: Meter, drafter) -> None:
    """Time ``drafter``'s begin, observe and end and its policy's next_gamma and timed."""
    for name in ("begin", "observe", "end"):
        setattr(drafter, name, meter.timed(name, getattr(drafter, name)))
    policy = drafter.policy
    policy.next_gamma = meter.timed("policy", policy.next_gamma)
    if callable(getattr(policy, "timed", None)):
        policy.timed = meter.timed("policy", policy.timed)


def auto_policies(policy) -> list[AutoPolicy]:
    """The cost-aware policies that decide for ``policy``: itself, or a merged drafter's parts' (``policies``)."""
    if isinstance(policy, AutoPolicy):
        return [policy]
    return [p for p in getattr(policy, "policies", ()) if isinstance(p, AutoPolicy)]


def decline(drafter) -> None:
    """Make ``drafter`` idle: its policy is asked every pass (it counts and plans) and answered 0. Cost-aware
    policies are put in their idle state first (c so high that no length pays: they plan every pass as they do when
    they draft nothing); their probes are asked for, and declined like every other pass."""
    policy = drafter.policy
    for auto in auto_policies(policy):
        auto.c_estimate = NEVER_PAYS_C
    ask = policy.next_gamma

    def declined() -> int:
        ask()
        return 0

    policy.next_gamma = declined


def log_passes(meter: Meter, drafter) -> None:
    """Record the policy's kind of each pass (plain, refresh, cold, probe, chosen, drafted) and each reported pass's
    draft tokens and accepted tokens in the running log."""
    policy = drafter.policy
    ask, update = policy.next_gamma, policy.update
    auto = policy if isinstance(policy, AutoPolicy) else None

    def next_gamma() -> int:
        refresh = auto is not None and auto.c_estimate is not None and auto.costs.refresh_due(auto.refresh_every)
        gamma = ask()
        meter.log.kinds.append(_kind(auto, gamma, refresh))
        return gamma

    def report(proposed, accepted, c=None, tokens=None, verified=None, overhead=None):
        meter.log.reported[len(meter.log.starts) - 1] = (tokens or proposed, accepted)
        return update(proposed, accepted, c, tokens=tokens, verified=verified, overhead=overhead)

    policy.next_gamma, policy.update = next_gamma, report


def _kind(auto: AutoPolicy | None, gamma: int, refresh: bool) -> str:
    if gamma == 0:
        return "refresh" if refresh else "plain"
    if auto is None:
        return "drafted"
    if auto.c_estimate is None:
        return "cold"
    return "probe" if auto._probing else "chosen"


@dataclass
class PassKinds:
    """Sums over one kind of pass: passes, those with a draft, draft tokens, tokens kept, cost in plain passes."""

    passes: int = 0
    drafted: int = 0
    draft_tokens: int = 0
    tokens: int = 0
    cost: float = 0.0

    HEADER = ("| drafter | kind | passes | share | with a draft | draft tokens | tokens a pass | cost a pass | "
              "net a request |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def add(self, draft_tokens: int, accepted: int, cost: float) -> None:
        self.passes += 1
        self.drafted += draft_tokens > 0
        self.draft_tokens += draft_tokens
        self.tokens += accepted + 1
        self.cost += cost


def probe_table(name: str, logs: list[RunLog]) -> list[str]:
    """Markdown rows: the default arm's decode passes by kind, each pass's CPU in its own request's plain passes."""
    kinds: dict[str, PassKinds] = defaultdict(PassKinds)
    total = 0
    for log in logs:
        durations = [b - a for a, b in zip(log.starts, [*log.starts[1:], log.end], strict=True)]
        plain = [d for i, d in enumerate(durations) if i and log.kinds[i] in ("plain", "refresh")
                 and log.reported.get(i, (0, 0))[0] == 0]
        unit = statistics.median(plain) if plain else statistics.median(durations[1:] or [math.nan])
        for i in range(1, len(durations)):
            if i not in log.reported:  # the request's last pass: its tokens were cut at the budget
                continue
            draft_tokens, accepted = log.reported[i]
            kinds[log.kinds[i]].add(draft_tokens, accepted, durations[i] / unit)
            total += 1
    rows = []
    for kind, sums in sorted(kinds.items()):
        n = max(sums.passes, 1)
        net = (sums.tokens - sums.cost) / max(len(logs), 1)
        rows.append(f"| {name} | {kind} | {sums.passes} | {sums.passes / max(total, 1):.1%} | {sums.drafted} | "
                    f"{sums.draft_tokens / n:.1f} | {sums.tokens / n:.2f} | {sums.cost / n:.2f} | {net:+.2f} |")
    return rows
