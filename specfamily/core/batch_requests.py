"""The batched loop's requests: one's state while it is in the batch, its admission into a slot and its retirement
(a part of :class:`specfamily.core.batch_loop._Batch`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from specfamily.core import acceptance, host
from specfamily.core.batch_slots import SlotTarget
from specfamily.core.batch_tally import Tally
from specfamily.core.context import DecodeContext
from specfamily.core.costs import CostCurve
from specfamily.core.drafter import Drafter, Hooks, hooks
from specfamily.core.loop import _bind_costs
from specfamily.core.metrics import MetricsRecorder
from specfamily.core.policy_protocol import policy_hooks
from specfamily.core.trace import TraceRecorder
from specfamily.core.types import GenerationResult

__all__ = ["BatchRequests", "Request"]


@dataclass
class Request:
    """One request's state while it is in the batch."""

    index: int
    ctx: DecodeContext
    drafter: Drafter | None
    own: Hooks | None
    accept: object
    pending: torch.Tensor  # (m,): the prompt before the prefill, then the root
    arrival: float  # seconds after the call
    started: float  # loop clock at admission
    tracer: TraceRecorder
    recorder: MetricsRecorder = field(default_factory=MetricsRecorder)
    new_tokens: list[int] = field(default_factory=list)
    prefilled: bool = False
    asked: int = 0  # steady passes its drafter was asked for tokens, and of those
    given: int = 0  # the ones it proposed some in (prompt lookup and suffix often find nothing to propose)
    done: bool = False
    tally: Tally = field(default_factory=Tally)  # its drafted levels verified and accepted, per depth
    synced: int = 0  # its context's length when its drafter last proposed (the tokens after: its backlog)


class BatchRequests:
    """Admission and retirement for the batched loop: its methods read the loop's ``target``, ``device``, ``batch``,
    ``live``, ``results``, ``prototype``, ``copier``, ``spare``, ``sampling``, ``seed``, ``clock``, ``origin``,
    ``trace``, ``load`` and ``gate``, and ``_alpha`` (:class:`~specfamily.core.batch_plan.BatchPlanning`)."""

    def _admit(self, index: int, ids: torch.Tensor, arrival: float) -> None:
        slot = len(self.live)
        generator = host.seeded_generator(self.device, self.seed + index)
        view = SlotTarget(self.target, self.batch.cache, slot)
        ctx = DecodeContext(view, ids, self.sampling, generator, tokens=ids.tolist())
        drafter = own = None
        if self.prototype is not None:
            drafter = self.spare.pop() if self.spare else self.copier.copy()
            own = hooks(drafter)
        self.batch.reset_slot(slot)
        recorder = MetricsRecorder()
        if drafter is not None:
            recorder.calibration_seconds = self._bind(drafter, ids)
        started = self.clock()
        tracer = TraceRecorder.start(self.clock, started, self.device, keep_passes=self.trace)
        request = Request(index, ctx, drafter, own, acceptance.acceptance(own, ctx), ids, arrival, started, tracer,
                          recorder)
        if drafter is not None:
            drafter.begin(ctx)
        self.live.append(request)

    def _bind(self, drafter: Drafter, ids: torch.Tensor) -> float:
        """Give the slot's policy a verify-cost curve where it plans with one; the seconds spent measuring it.

        Under draft length by load the batch plans every length from the row costs its own passes measure (t(B, N),
        ``batch_lengths.RowCosts``) and the slot's policy lends it only its acceptance: the batch-1 curve
        t(g + 1) / t(1) (``costs.target_cost_curve``, ~2 s of passes at SmolLM2's size) would be measured for nothing
        inside the first run's clock. The policy gets the curve when batch 1 has measured it on this target, and
        nothing is measured. Else (a slot policy that plans its own lengths) as ``generate`` does: measured once per
        target, shared with batch 1."""
        own = policy_hooks(drafter.policy)
        if self.load is None:
            return _bind_costs(own, self.target, ids, self.clock)
        if own.bind is not None and self.target.verify_costs is not None:
            own.bind(CostCurve.of(self.target.verify_costs))
        return 0.0

    def _retire(self) -> None:
        """Finish the done requests and keep the live ones packed in slots 0.. (the last moves into a hole)."""
        slot = 0
        while slot < len(self.live):
            request = self.live[slot]
            if not request.done:
                slot += 1
                continue
            self._finish(request)
            last = len(self.live) - 1
            if slot != last:
                self.batch.move(last, slot)
                self.live[slot] = self.live[last]
                self.live[slot].ctx.target.slot = slot
            self.live.pop()

    def _note(self, request: Request) -> str:
        """What planned this request's drafts: the batch's length policy (the slot's own policy only lent it its
        acceptance estimate) or, without one, the slot's own policy, with the load gate's verdicts for a drafter it
        gates (one it closed drafts only in probes: the note says so)."""
        if request.drafter is None:
            return ""
        if self.load is None:
            own = policy_hooks(request.drafter.policy).describe()
            return "; ".join(filter(None, [own, self.gate.describe() if self.gate is not None else ""]))
        alpha = ", ".join(f"{a:.2f}" for a in self._alpha(request)[:4])
        return (f"{self.load.describe()} (the batch's length policy decided every pass; this request's drafter "
                f"proposed in {request.given} of the {request.asked} passes it was asked to, acceptance at depths 1-4 "
                f"[{alpha}])")

    def _finish(self, request: Request) -> None:
        """The request's result; its drafter, ended, serves the next admission (one instance per slot, as one
        drafter serves request after request at batch 1: a copy at every admission cost hydra, merge and suffix
        up to ~0.15% of a run at B=16; docs/batching-log.md, session 36)."""
        if request.own is not None:
            request.own.end()
        drafter = request.drafter
        if drafter is not None:
            self.spare.append(drafter)
        lossy = bool(drafter is not None and drafter.lossy)
        note = self._note(request)
        now = self.clock()
        metrics = request.recorder.finish(len(request.new_tokens), now - request.started, lossy=lossy,
                                          policy_note=note)
        metrics, passes = request.tracer.finish(metrics)
        metrics = replace(metrics, arrival_s=request.arrival, finish_s=now - self.origin,
                          first_token_s=request.started - self.origin + metrics.time_to_first_token)
        self.results[request.index] = GenerationResult(request.new_tokens, metrics, lossy, passes)
