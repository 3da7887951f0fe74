"""Whether a drafter that keeps lengths of its own drafts at a batch size: its drafted passes against its plain ones.

The batched loop plans draft lengths by load only for cost-aware drafters (``AutoPolicy``: ``batch_lengths``). A drafter
whose defaults keep lengths of their own (lookahead decoding's constant N - 1, whose Jacobi window runs only in passes
that draft; merge's parts' policies) drafts them at every load, and where a pass of many requests costs several plain
passes its drafts lose however well they are accepted. :class:`LoadGate` measures, per batch size, the committed tokens
per second of the steady passes that asked for drafts (whatever came back) and of those that did not (in a batch's
last wave the progress of its projected end instead: tokens of slots that run ahead end it no sooner), and lets the
drafter's own lengths through while its drafted passes beat its plain ones (by ``min_gain``, a noise margin); else the
pass drafts nothing, but for a probe every ``probe_every`` passes, backing off while probes keep losing, and never
sooner than lets a probe's extra seconds over a plain pass stay within ``probe_share`` of the plain passes between
probes (merge's drafted pass at B=8 costs several plain ones: one every 16 passes spent more than its drafts ever won).
A batch size it has not drafted at yet goes by a losing one no fuller, or at most ``near`` times fuller, until its own
first drafted pass (:meth:`LoadGate.lost_near`), else drafts to measure.
A plain pass is measured first at each batch size and again every ``refresh_every`` drafted passes. A pass that prefills
a newcomer is not measured; on it the drafter drafts only where the gate is open (:meth:`LoadGate.opens`): no probe, no
measurement, rows beside a prompt's. Only a drafter at its defaults is gated (:func:`gated`): a length a user chose (a
``gamma`` or ``policy`` given) is left alone, as the conformance kit's and the sweep's fixed-gamma runs need. The
verdict is kept across runs per drafter class on the target. ``generate`` gates such a drafter at batch 1 too when its
policy weighs no costs (:func:`gated_alone`: lookahead at its defaults lost 13% to plain decoding at batch 1 under
sampling, docs/batching.md), with the same verdicts as a batch's last lone slot.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from specfamily.core.batch_kept import kept_record
from specfamily.core.policy import AutoPolicy

__all__ = ["GateWindow", "LoadGate", "gated", "gated_alone", "kept_gate"]


@dataclass
class GateWindow:
    """One batch size's latest drafted and plain steady passes, (tokens brought, seconds) each."""

    drafted: deque = field(default_factory=lambda: deque(maxlen=16))
    plain: deque = field(default_factory=lambda: deque(maxlen=16))
    since_plain: int = 0  # drafted passes since the last plain one
    idle: int = 0  # plain passes since the last drafted one
    losing: int = 0  # probes in a row that did not beat the plain passes

    @staticmethod
    def rate(passes: deque) -> float | None:
        seconds = sum(s for _, s in passes)
        return sum(t for t, _ in passes) / seconds if passes and seconds > 0 else None

    @staticmethod
    def seconds(passes: deque) -> float | None:
        """A pass's mean seconds (None: none measured)."""
        return sum(s for _, s in passes) / len(passes) if passes else None


@dataclass
class LoadGate:
    """Per batch size, whether the drafter's own lengths go through (:meth:`lengths`), from what passes realized
    (:meth:`record`)."""

    min_gain: float = 1.02  # drafted passes must beat plain ones' tokens a second by this factor (a noise margin)
    probe_every: int = 16
    max_backoff: int = 5  # probes at a load that keeps losing: every probe_every * 2**k passes, k <= max_backoff
    refresh_every: int = 32
    near: float = 1.5  # a batch size goes by a losing one at most this many times fuller (lost_near)
    probe_share: float = 0.01  # a probe's extra seconds at most this share of the plain passes' since the last one
    # (probing and a drafter's idle bookkeeping must fit together in the 2% a drafter may lose: docs/batching.md)
    windows: dict[int, GateWindow] = field(default_factory=dict)

    def lengths(self, gammas: list[int]) -> list[int]:
        """``gammas`` (the slots' own lengths) if the drafter drafts at this batch size this pass, else none."""
        window = self.windows.setdefault(len(gammas), GateWindow())
        if not window.plain or window.since_plain >= self.refresh_every:
            return [0] * len(gammas)  # a plain pass to measure against
        guide = self._guide(window, len(gammas))
        if guide is None:  # open, or no drafted pass measured that says closed
            return gammas
        if window.idle + 1 >= self.interval(guide):
            return gammas  # a probe: what drafting realizes now
        return [0] * len(gammas)

    def _guide(self, window: GateWindow, batch: int) -> GateWindow | None:
        """The window whose losing verdict closes ``batch`` this pass: its own once it drafted (if closed), else a
        losing one near it (:meth:`lost_near`); None: it drafts."""
        if window.drafted:
            return window if self.closed(window) else None
        return self.lost_near(batch)

    def lost_near(self, batch: int) -> GateWindow | None:
        """For a batch size the drafter has not drafted at, the window (drafted and plain passes measured, drafts
        losing) whose verdict it goes by until its own first drafted pass: drafts lose more the fuller the batch, so
        losing at a batch size no fuller says they lose here, and losing at one at most ``near`` times fuller is the
        best guess there is (exploring every size a last wave shrinks through cost merge a drafted pass each, 9
        plain ones at B=16: docs/batching-log.md, session 33); the nearest by ratio of them, else None (it drafts to
        measure)."""
        near = sorted((abs(math.log(size / batch)), size) for size in self.windows if size <= self.near * batch)
        return next((self.windows[size] for _, size in near if self.closed(self.windows[size])), None)

    def opens(self, batch: int) -> bool:
        """Whether drafted passes at ``batch`` beat its plain ones now (both measured): a pass the gate does not
        record (one that prefills a newcomer) drafts only then."""
        window = self.windows.get(batch)
        return window is not None and self.beats(window) is True

    def beats(self, window: GateWindow) -> bool | None:
        """Whether ``window``'s drafted passes beat its plain ones in tokens a second by ``min_gain`` (None: either
        kind not measured)."""
        plain, drafted = GateWindow.rate(window.plain), GateWindow.rate(window.drafted)
        return None if plain is None or drafted is None else drafted > self.min_gain * plain

    def interval(self, window: GateWindow) -> int:
        """Plain passes from one probe to the next while closed: ``probe_every``, doubled for each probe in a row
        that lost (up to ``max_backoff`` times), and at least as many as keep a probe's extra seconds over a plain
        pass within ``probe_share`` of theirs."""
        backoff = self.probe_every * 2 ** min(window.losing, self.max_backoff)
        plain, drafted = GateWindow.seconds(window.plain), GateWindow.seconds(window.drafted)
        if plain is None or drafted is None or drafted <= plain:
            return backoff
        return max(backoff, math.ceil((drafted - plain) / (self.probe_share * plain)))

    def record(self, batch: int, drafted: bool, tokens: float, seconds: float) -> None:
        """A steady pass at ``batch`` that brought the batch ``tokens`` (committed ones; in a last wave its end's
        advance for every slot, the loop's ``_brought``) in ``seconds``, drafted or not."""
        if seconds <= 0:
            return
        window = self.windows.setdefault(batch, GateWindow())
        if not drafted:
            window.plain.append((tokens, seconds))
            window.since_plain, window.idle = 0, window.idle + 1
            return
        closed = self.closed(window)
        window.drafted.append((tokens, seconds))
        window.since_plain, window.idle = window.since_plain + 1, 0  # plain passes are counted from the last drafted
        if closed:  # a probe: the back-off grows while drafting keeps losing
            window.losing = window.losing + 1 if self.closed(window) else 0

    def describe(self) -> str:
        """Its verdict at every batch size it measured, for results (a drafter it closes drafts only in probes and
        would otherwise read as a drafter that found nothing)."""
        parts = []
        for batch, window in sorted(self.windows.items()):
            plain, drafted = GateWindow.rate(window.plain), GateWindow.rate(window.drafted)
            if plain is None or drafted is None:
                parts.append(f"B={batch} measuring")
                continue
            verdict = f"closed, probes every {self.interval(window)} passes" if self.closed(window) else "open"
            parts.append(f"B={batch} {verdict} (drafted passes {drafted:.3g} tokens/s, plain {plain:.3g})")
        return "load gate: " + ("; ".join(parts) or "nothing measured")

    def closed(self, window: GateWindow) -> bool:
        """Whether ``window``'s drafted passes, both kinds measured, do not beat its plain ones by ``min_gain``."""
        return self.beats(window) is False


def gated(drafter) -> bool:
    """Whether the batched loop gates ``drafter`` by load: not cost-aware (the length policy plans those) and at its
    defaults (its config gives neither a gamma nor a policy)."""
    if drafter is None or isinstance(drafter.policy, AutoPolicy):
        return False
    config = getattr(drafter, "config", None)
    return config is not None and getattr(config, "gamma", 0) is None and getattr(config, "policy", 0) is None


def gated_alone(drafter) -> bool:
    """Whether ``generate`` gates ``drafter`` at batch 1: gated by load (:func:`gated`) and its policy plans with no
    costs at all (no ``bind`` hook taking the verify-cost curve: merge's parts' cost-aware policies already decide
    alone whether their drafts pay; lookahead's constant length never does)."""
    return gated(drafter) and not callable(getattr(drafter.policy, "bind", None))


def kept_gate(target, drafter) -> LoadGate:
    """``drafter``'s class's gate on ``target``, kept across ``generate_batch`` calls beside its realized windows
    (``Target.batch_realized``; a target without it: a fresh one, the run's own)."""
    return kept_record(target, drafter, "gate", LoadGate)
