"""Per-request metrics: acceptance (alpha), tau, per-position acceptance, timings, measured c.

The decode loop feeds a ``MetricsRecorder`` one ``record_pass`` per target forward pass (the
prefill pass included, as a pass without a proposal) and calls ``finish`` at the end; the numbers
are computed by the small pure functions below, so timing stays out of the math.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field
from typing import Any

NAN = float("nan")


@dataclass
class Metrics:
    """What one request measured. Ratios with nothing to count are nan."""

    new_tokens: int
    target_passes: int  # the prefill pass included
    draft_steps: int  # drafter forward/proposal steps
    proposed_tokens: int
    accepted_tokens: int
    acceptance_rate: float  # alpha: accepted / (accepted + passes whose verifier rejected every child it tried last)
    draft_acceptance: float  # accepted / proposed tokens
    mean_accepted_length: float  # tau = new_tokens / target_passes; plain decoding: 1.0
    per_position_acceptance: list[float]  # cumulative, i: P(accepted length > i) over the passes that drafted deeper
    # than i, leaving out those that stopped at an accepted leaf above depth i + 1 (levels the verifier never tried)
    draft_seconds: float
    verify_seconds: float
    other_seconds: float
    total_seconds: float
    c: float  # one draft step's time / one verification pass's time (prefill and passes without a proposal left out)
    lossy: bool = False
    catch_up_seconds: float = 0.0  # of draft_seconds, feeding drafters context they had not seen (not in c)
    calibration_seconds: float = 0.0  # one-time verify-cost measurement before this request (not in total_seconds)
    drafted_share: float = NAN  # passes after the prefill that verified a draft / passes after the prefill
    policy_note: str = ""  # the draft-length policy's own account (the cost-aware one says why it drafts or not)
    conditional_acceptance: list[float] = field(default_factory=list)  # i: of the passes whose verifier tried a node
    # at depth i + 1, the share that accepted one there (vLLM's per-position rate)
    prefill_seconds: float = NAN  # verify time of the first pass (the prompt's prefill); the rest are steady passes
    drafted_passes: int = 0  # passes after the prefill that verified a draft ...
    drafted_verify_seconds: float = 0.0  # ... and their verify time: what a drafted pass costs in this run
    time_to_first_token: float = NAN  # start of the request (drafter.begin included) to the first token
    decode_seconds: float = NAN  # the rest: total_seconds - time_to_first_token
    token_latency_p50: float = NAN  # per token after the first (its pass's interval / tokens the pass kept), seconds
    token_latency_p90: float = NAN
    token_latency_p99: float = NAN
    peak_memory_bytes: int | None = None  # this request's peak: max allocated on CUDA, RSS on the CPU ...
    peak_memory_kind: str = ""  # ... which one (specfamily.core.memory)
    arrival_s: float = NAN  # generate_batch only, seconds since its call: when the request arrived,
    first_token_s: float = NAN  # when its first new token was committed,
    finish_s: float = NAN  # and when it finished (its latency, queueing included: finish_s - arrival_s)

    def as_dict(self) -> dict[str, Any]:
        """Flat and JSON-friendly: nan becomes None."""
        return {key: _json_value(value) for key, value in asdict(self).items()}


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_json_value(item) for item in value]
    return value


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, nan when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else NAN


def estimate_alpha(accepted: int, rejections: int) -> float:
    """Per-position acceptance: each proposal is a run of accepts ended by at most one rejection."""
    return ratio(accepted, accepted + rejections)


def cost_ratio(draft_seconds: float, draft_steps: int, verify_seconds: float, verify_passes: int) -> float:
    """c = (time per draft step) / (time per target pass); nan without draft steps or verify time."""
    if draft_steps <= 0 or verify_passes <= 0 or verify_seconds <= 0:
        return NAN
    return (draft_seconds / draft_steps) / (verify_seconds / verify_passes)


def per_position_acceptance(proposed_at: list[int], accepted_at: list[int]) -> list[float]:
    """i: of the proposals counted at depth i + 1 (``proposed_at``), the share accepted there (``accepted_at``).

    With the recorder's cumulative counts this is P(accepted length > i); with its ``tried_at`` counts the
    conditional rate at depth i + 1."""
    return [ratio(accepted, proposed) for proposed, accepted in zip(proposed_at, accepted_at, strict=True)]


def counted_depth(proposed_depth: int, accepted: int, verified_depth: int) -> int:
    """How deep a pass counts for the cumulative per-position acceptance: the drafted depth when the verifier
    rejected at its last tried level (the deeper levels were proposed and not reached), else only the levels it
    tried (a path accepted down to a leaf above the deepest level never failed deeper)."""
    return proposed_depth if verified_depth > accepted else verified_depth


def _check_count(value: int, name: str) -> int:
    try:
        count = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        count = None
    if count is None or count < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return count


def _check_verified(verified_depth: int | None, proposed_depth: int, accepted: int) -> int:
    if verified_depth is None:
        return min(accepted + 1, proposed_depth)
    verified_depth = _check_count(verified_depth, "verified_depth")
    if not accepted <= verified_depth <= proposed_depth:
        raise ValueError(f"verified_depth ({verified_depth}) must lie between accepted ({accepted}) and "
                         f"proposed_depth ({proposed_depth})")
    return verified_depth


def _check_seconds(value: float, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return value


@dataclass
class MetricsRecorder:
    """Accumulates one request's passes; ``finish`` turns them into ``Metrics``.

    The first recorded pass is the prefill (the loop's contract). c leaves it out, and counts
    verify time only of passes that verified a proposal and draft time only of passes with draft
    steps, so a long prompt's prefill does not skew it.
    """

    target_passes: int = 0
    proposals: int = 0
    rejections: int = 0
    draft_steps: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    c_draft_steps: int = 0  # for c, after the prefill pass: draft steps,
    c_draft_seconds: float = 0.0  # their time,
    c_verify_passes: int = 0  # passes that verified a proposal,
    c_verify_seconds: float = 0.0  # and their time
    catch_up_seconds: float = 0.0
    calibration_seconds: float = 0.0
    prefill_seconds: float = NAN
    proposed_at: list[int] = field(default_factory=list)  # i: passes counted at depth i + 1 (see counted_depth)
    accepted_at: list[int] = field(default_factory=list)  # i: passes that accepted a node at depth i + 1
    tried_at: list[int] = field(default_factory=list)  # i: passes whose verifier tried a node at depth i + 1

    def record_pass(
        self,
        proposed_depth: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        draft_steps: int | None = None,
        proposed_tokens: int | None = None,
        catch_up_seconds: float = 0.0,
        verified_depth: int | None = None,
    ) -> None:
        """One target pass: draft depth proposed (0: none), draft tokens accepted, times.

        ``draft_steps`` defaults to ``proposed_depth`` (a chain drafter's steps); ``proposed_tokens``
        defaults to ``proposed_depth`` (a tree drafter passes its node count); ``verified_depth``, the levels the
        verifier tried (``Draft.verified_depth``), defaults to a chain's: one past the accepted tokens, at most
        the drafted depth. A pass rejected a draft only when the verifier tried a level and accepted nothing there.
        """
        proposed_depth = _check_count(proposed_depth, "proposed_depth")
        accepted = _check_count(accepted, "accepted")
        if accepted > proposed_depth:
            raise ValueError(f"accepted ({accepted}) cannot exceed proposed_depth ({proposed_depth})")
        draft_steps = _check_count(proposed_depth if draft_steps is None else draft_steps, "draft_steps")
        proposed_tokens = proposed_depth if proposed_tokens is None else proposed_tokens
        proposed_tokens = _check_count(proposed_tokens, "proposed_tokens")
        if proposed_tokens < proposed_depth:
            raise ValueError(f"proposed_tokens ({proposed_tokens}) cannot be below proposed_depth ({proposed_depth})")
        draft_seconds = _check_seconds(draft_seconds, "draft_seconds")
        verify_seconds = _check_seconds(verify_seconds, "verify_seconds")
        catch_up_seconds = min(_check_seconds(catch_up_seconds, "catch_up_seconds"), draft_seconds)
        verified_depth = _check_verified(verified_depth, proposed_depth, accepted)

        self.catch_up_seconds += catch_up_seconds
        if self.target_passes == 0:
            self.prefill_seconds = verify_seconds
        else:
            self._count_cost(proposed_depth, draft_steps, draft_seconds - catch_up_seconds, verify_seconds)
        self.target_passes += 1
        self.draft_steps += draft_steps
        self.proposed_tokens += proposed_tokens
        self.accepted_tokens += accepted
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds
        if proposed_depth:
            self.proposals += 1
            self.rejections += int(verified_depth > accepted)
            self._count_positions(counted_depth(proposed_depth, accepted, verified_depth), accepted, verified_depth)

    def _count_cost(self, proposed_depth: int, draft_steps: int, draft_seconds: float, verify_seconds: float) -> None:
        if draft_steps:
            self.c_draft_steps += draft_steps
            self.c_draft_seconds += draft_seconds
        if proposed_depth:
            self.c_verify_passes += 1
            self.c_verify_seconds += verify_seconds

    def _count_positions(self, counted: int, accepted: int, verified: int) -> None:
        missing = counted - len(self.proposed_at)
        if missing > 0:
            for counts in (self.proposed_at, self.accepted_at, self.tried_at):
                counts.extend([0] * missing)
        for i in range(counted):
            self.proposed_at[i] += 1
            self.accepted_at[i] += int(i < accepted)
            self.tried_at[i] += int(i < verified)

    def running_c(self) -> float | None:
        """c so far, for draft-length policies; None while it cannot be measured yet."""
        c = self._c()
        return None if math.isnan(c) else c

    def _c(self) -> float:
        return cost_ratio(self.c_draft_seconds, self.c_draft_steps, self.c_verify_seconds, self.c_verify_passes)

    def finish(self, new_tokens: int, total_seconds: float, lossy: bool = False, policy_note: str = "") -> Metrics:
        """The request's Metrics; other_seconds = total - draft - verify (floored at 0)."""
        new_tokens = _check_count(new_tokens, "new_tokens")
        total_seconds = _check_seconds(total_seconds, "total_seconds")
        return Metrics(
            new_tokens=new_tokens,
            target_passes=self.target_passes,
            draft_steps=self.draft_steps,
            proposed_tokens=self.proposed_tokens,
            accepted_tokens=self.accepted_tokens,
            acceptance_rate=estimate_alpha(self.accepted_tokens, self.rejections),
            draft_acceptance=ratio(self.accepted_tokens, self.proposed_tokens),
            mean_accepted_length=ratio(new_tokens, self.target_passes),
            per_position_acceptance=per_position_acceptance(self.proposed_at, self.accepted_at),
            draft_seconds=self.draft_seconds,
            verify_seconds=self.verify_seconds,
            other_seconds=max(0.0, total_seconds - self.draft_seconds - self.verify_seconds),
            total_seconds=total_seconds,
            c=self._c(),
            lossy=bool(lossy),
            catch_up_seconds=self.catch_up_seconds,
            calibration_seconds=self.calibration_seconds,
            drafted_share=ratio(self.proposals, self.target_passes - 1),
            policy_note=policy_note,
            conditional_acceptance=per_position_acceptance(self.tried_at, self.accepted_at),
            prefill_seconds=self.prefill_seconds,
            drafted_passes=self.c_verify_passes,
            drafted_verify_seconds=self.c_verify_seconds,
        )
