"""A steady batched pass's verdict to draft nothing, held over the passes that cannot change it (a part of the
batched loop's planning: :class:`specfamily.core.batch_plan.BatchPlanning`).

Under draft length by load a pass's plan rests on each slot's acceptance (its own counts over the batch's pool), on
how the batch's last wave values its slots, on the measured costs and on the probe schedule. A pass that drafts
nothing adds no count, and in a last wave moves every slot one token nearer its end, so the slots' standing to one
another is unchanged: the next pass's inputs differ from this one's only by one cached token a slot and the cost
model's refit. Planning anew each time is host work between two forwards on every pass of a load where drafting does
not pay, the passes whose time is plain decoding's; so a verdict to draft nothing (``idle``: nothing pays; ``joint``:
the batch's tied last slots, planned together, draft nothing) is kept while its key holds (the same slots, the same
wave, the same side of the last wave's joint end, no count added, no probe due) and re-planned every ``passes``
passes against the drift, or every ``per_slot`` passes a slot where that is longer: a plan's host time grows with the
batch (each slot's prospect, and a copy drafter's full-length proposals: docs/batching-log.md, session 34) while a batch
that full seldom drafts. A verdict to draft, and ``none`` (a table not measured yet, a refresh due), is never held.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["HELD_KINDS", "VerdictHold"]

HELD_KINDS = ("idle", "joint")  # LengthPolicy.kind of a verdict to draft nothing that may be held


@dataclass
class VerdictHold:
    """The last verdict to draft nothing, its key, and the passes it may still stand for."""

    passes: int = 8  # a held verdict is planned anew at least every this many passes,
    per_slot: int = 1  # or every this many a slot of the pass if that is more (a plan's host time grows with B)
    key: Hashable | None = None
    kind: str = ""
    left: int = 0

    def held(self, key: Hashable, probe_due: bool) -> str | None:
        """The kind of the verdict that stands for this pass (its lengths are none), or None: plan it. ``probe_due``:
        an idle pass now would be a probe (an idle verdict then does not stand)."""
        if self.left <= 0 or key != self.key or (probe_due and self.kind == "idle"):
            self.left = 0
            return None
        self.left -= 1
        return self.kind

    def keep(self, key: Hashable, kind: str, drafted: bool, slots: int = 0) -> None:
        """After a pass of ``slots`` requests planned anew: hold its verdict for the next ``max(passes, per_slot *
        slots) - 1`` passes if it drafts nothing and is of a kind that may be held."""
        if drafted or kind not in HELD_KINDS:
            self.left = 0
            return
        self.key, self.kind, self.left = key, kind, max(self.passes, self.per_slot * slots) - 1
