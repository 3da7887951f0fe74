"""Whether a load's last waves end sooner for drafting apart: each run's last wave measured, the verdict kept.

In a batch's last wave (no request waits for more than one slot) the batch ends with its last slot, and the plan
values a slot's token by its chance of being that slot (``batch_goodput.finishing``): tied slots far from the end
each count 1/B, as if every slot drafted often enough for its end to wander. Where few slots find drafts (prompt
lookup or suffix on prompts with little to copy, a batch of 4-8 requests whose passes cost several rows each), the
slots that draft only run ahead of the ones that do not, and the batch ends no sooner: their passes cost more and
saved nothing. :class:`WaveLedger` measures it: over a run's steady last-wave passes, how many tokens each brought
the batch's projected end nearer (``batch_goodput.projected_ends``: 1 on a plain pass) per second, over what a
plain pass does per second (the table's price, its measured-over-priced ratio taken from the wave's own undrafted
passes). A run whose wave drafted apart and came out below plain pricing closes its load to apart plans in last
waves (:func:`judge`, on the load's kept :class:`~specfamily.core.batch_goodput.Realized`): for the next
``closed_runs`` runs only joint plans (every slot at the batch's end drafting to one depth, or none:
``batch_goodput.plan_together``) draft there, then the load tries again (docs/batching-log.md, session 29).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WaveLedger", "judge"]


@dataclass
class WaveLedger:
    """One run's steady last-wave passes: the progress of the batch's projected end, the seconds measured, and a
    plain pass's price beside each; apart: the passes that drafted apart (not jointly)."""

    passes: int = 0
    progress: float = 0.0  # tokens the batch's projected end came nearer over the passes (a plain pass: 1)
    seconds: float = 0.0
    priced: float = 0.0
    plain_seconds: float = 0.0  # the undrafted passes' seconds and prices: the yardstick of the others
    plain_priced: float = 0.0
    apart: int = 0

    def record(self, advance: float, seconds: float, priced: float | None, drafted: bool, apart: bool) -> None:
        """A pass that brought the batch's projected end ``advance`` tokens nearer in ``seconds``, where a plain
        pass is priced ``priced`` (None: not priced yet, not recorded)."""
        if priced is None or priced <= 0 or seconds <= 0:
            return
        self.passes += 1
        self.progress += advance
        self.seconds += seconds
        self.priced += priced
        if not drafted:
            self.plain_seconds += seconds
            self.plain_priced += priced
        self.apart += apart

    def rate(self) -> float | None:
        """The wave's progress a second over plain decoding's: its progress a pass over its cost a pass, the cost
        its seconds over its prices relative to its undrafted passes' (None without undrafted passes)."""
        if not self.passes or self.plain_seconds <= 0 or self.plain_priced <= 0:
            return None
        cost = (self.seconds / self.priced) / (self.plain_seconds / self.plain_priced)
        return (self.progress / self.passes) / cost


def judge(ledger: WaveLedger, kept, least_apart: int = 3, closed_runs: int = 4) -> None:
    """After a run: a last wave that drafted apart on at least ``least_apart`` passes closes the load's apart plans
    in last waves for ``closed_runs`` runs if it came out slower than plain pricing, else opens them; a run that
    did not draft apart there counts one closed run down. ``kept``: the load's kept record (``waves_closed``)."""
    rate = ledger.rate()
    if ledger.apart >= least_apart and rate is not None:
        kept.waves_closed = closed_runs if rate < 1.0 else 0
    elif kept.waves_closed > 0:
        kept.waves_closed -= 1
