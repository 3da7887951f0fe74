"""Drafted levels verified and accepted per depth, for the batched loop's acceptance estimates: a request's own, the
batch's pooled (:func:`kept_tally`, kept across calls), a copy drafter's by evidence (``batch_evidence``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specfamily.core.batch_kept import kept_record

__all__ = ["Tally", "kept_tally"]


@dataclass
class Tally:
    """Drafted levels verified and accepted, per depth: a request's own, or the batch's pooled over its requests."""

    tried: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def add(self, tried: int, accepted: int) -> None:
        """A pass that verified ``tried`` levels and accepted ``accepted`` of them (from the root down)."""
        self._grow(tried)
        for depth in range(tried):
            self.tried[depth] += 1
        for depth in range(min(accepted, tried)):
            self.accepted[depth] += 1

    def add_level(self, depth: int, accepted: bool) -> None:
        """One level at ``depth`` (1: the first) verified, accepted or not, its shallower levels counted before."""
        self._grow(depth)
        self.tried[depth - 1] += 1
        self.accepted[depth - 1] += accepted

    def _grow(self, depth: int) -> None:
        more = [0.0] * max(0, depth - len(self.tried))
        self.tried, self.accepted = self.tried + more, self.accepted + more

    def alpha(self, prior: Sequence[float], weight: float) -> list[float]:
        """Conditional acceptance at depths 1 .. len(prior): the counts, with ``prior`` worth ``weight`` passes."""
        out = []
        for d, a in enumerate(prior):
            tried, accepted = (self.tried[d], self.accepted[d]) if d < len(self.tried) else (0.0, 0.0)
            out.append((accepted + a * weight) / (tried + weight))
        return out


def kept_tally(target, drafter) -> Tally:
    """The batch's pooled acceptance for ``drafter``'s class on ``target``, kept across ``generate_batch`` calls
    (beside the realized windows, ``Target.batch_realized``; a target without it: a fresh tally, the run's own).
    A call that started from the drafter's prior (worth ``batch_plan._POOL_WEIGHT`` passes) let its first requests'
    first few misses pull every request's estimate to ~0.1, which then drafted nothing to learn otherwise
    (docs/batching-log.md, session 25)."""
    return kept_record(target, drafter, "acceptance", Tally)
