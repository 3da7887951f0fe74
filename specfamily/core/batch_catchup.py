"""What a slot's drafter spends catching up before it drafts, priced by the batched loop's plans.

A drafter with state of its own (EAGLE's and Medusa's feature queues, a small model's cache) first feeds what was
committed since it last proposed (``Draft.catch_up_seconds``): the prompt at its first proposal, a token or so a pass
while it drafts on every pass, every token of an idle stretch after one. The batch's draft step is measured without
it (``RowCosts.observe_draft``), so a plan that ignored it priced a probe after a long idle stretch, or a plan right
after one, at a fraction of what it costs. :class:`CatchUp` learns the seconds per token caught up from the passes'
proposals (a ratio of sums over a window, kept across runs per drafter class on the target: a run's first plans
are priced by the last run's), and each slot's prospect carries its start (``Prospect.start``: its backlog, the
tokens committed since its drafter last proposed, times that rate), paid by a plan that drafts the slot at all.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from specfamily.core.batch_kept import kept_record

__all__ = ["CatchUp", "kept_catch_up"]


@dataclass
class CatchUp:
    """Tokens caught up and their seconds, per pass that proposed, over the latest ``window`` such passes."""

    window: int = 32
    passes: deque = field(default_factory=deque)  # (tokens, seconds) of each pass that proposed with a backlog

    def observe(self, tokens: int, seconds: float) -> None:
        """A pass's proposals caught up ``tokens`` committed tokens in all, in ``seconds``."""
        if tokens <= 0 or seconds < 0:
            return
        self.passes.append((tokens, seconds))
        while len(self.passes) > self.window:
            self.passes.popleft()

    def per_token(self) -> float:
        """Seconds per token caught up (0 until a pass with a backlog was measured)."""
        tokens = sum(t for t, _ in self.passes)
        return sum(s for _, s in self.passes) / tokens if tokens else 0.0


def kept_catch_up(target, drafter) -> CatchUp:
    """The catch-up rate of ``drafter``'s class on ``target``, kept across ``generate_batch`` calls beside its
    realized windows (``Target.batch_realized``; a target without it: a fresh one, the run's own)."""
    return kept_record(target, drafter, "catch_up", CatchUp)
