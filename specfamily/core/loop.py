"""The decode loop: propose -> verify (one target pass) -> commit -> observe.

``drafter=None`` is plain autoregressive decoding through the very same target calls, so that
timings compare fairly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specfamily.core import acceptance, host
from specfamily.core.batch_gate import LoadGate, gated_alone, kept_gate
from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock, process_clock, target_cost_curve
from specfamily.core.drafter import Drafter, drafter_name, hooks
from specfamily.core.metrics import MetricsRecorder
from specfamily.core.policy_kept import continue_policy
from specfamily.core.policy_protocol import BoundHooks, policy_hooks
from specfamily.core.target import Target
from specfamily.core.trace import TraceRecorder
from specfamily.core.types import Draft, GenerationResult, SamplingConfig, VerifyOutcome
from specfamily.core.verify import DraftProbabilityError


def truncate(tokens: list[int], budget: int, eos_token_ids: int | Sequence[int] | None) -> tuple[list[int], bool]:
    """Cut committed tokens at the budget and just after the first EOS: (kept, finished)."""
    kept = tokens[:budget]
    stops = () if eos_token_ids is None else (eos_token_ids,) if isinstance(eos_token_ids, int) else eos_token_ids
    ends = [i for i, token in enumerate(kept) if token in stops]
    if ends:
        return kept[: ends[0] + 1], True
    return kept, len(kept) == budget


def _check_request(drafter: Drafter | None, max_new_tokens: int, sampling: SamplingConfig) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specfamily.SamplingConfig, got {type(sampling).__name__}")
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must implement begin/propose/observe, got {type(drafter).__name__}")


def _propose(drafter: Drafter | None, ctx: DecodeContext, remaining: int, empty: Draft,
             gate: LoadGate | None = None, steady: bool = True) -> Draft:
    """The drafter's proposal, with gamma capped so no pass drafts past the token budget (``empty`` otherwise), and,
    for a drafter at lengths of its own whose policy weighs no costs (``gate``: lookahead's at its defaults), drafted
    only where its drafted passes beat its plain ones at batch 1, as the batched loop gates it at every batch size
    (``batch_gate``); a pass that prefills the prompt (not ``steady``) drafts only where the gate is open."""
    if drafter is None:
        return empty
    gamma = min(drafter.policy.next_gamma(), remaining - 1)
    if gate is not None and steady:
        gamma = gate.lengths([gamma])[0]
    elif gate is not None and not gate.opens(1):
        gamma = 0
    return drafter.propose(ctx, gamma) if gamma > 0 else empty


def _outcome(draft: Draft, accepted: list[int], committed: list[int], features, pending: int, start: int,
             logits: torch.Tensor | None = None, side_logits: torch.Tensor | None = None) -> VerifyOutcome:
    rows = None if features is None else _feature_rows(features, pending, accepted)
    return VerifyOutcome(committed, accepted, len(draft), rows, start, logits, side_logits, draft.tokens)


def _feature_rows(features: torch.Tensor, pending: int, accepted: list[int]) -> torch.Tensor:
    """A copy of the features (m + n, W) of the pending rows and the accepted nodes' rows, in path order: one copy of
    the leading rows when the path is the draft's first nodes (a chain's, or none: every pass that drafts nothing)."""
    k = len(accepted)
    if accepted == list(range(k)):
        return features[: pending + k].clone()
    index = torch.cat([torch.arange(pending), pending + torch.tensor(accepted, dtype=torch.long)])
    return features.index_select(0, index.to(features.device, non_blocking=True))


def generate(
    target: Target,
    drafter: Drafter | None,
    prompt_ids,
    max_new_tokens: int = 64,
    sampling: SamplingConfig | None = None,
    seed: int = 0,
    trace: bool = True,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids``, stopping after EOS; ``trace``: keep every pass in
    ``result.trace`` (the latency and memory metrics are measured either way)."""
    sampling = SamplingConfig() if sampling is None else sampling
    _check_request(drafter, max_new_tokens, sampling)
    ids = target.check_ids(prompt_ids)
    generator = host.seeded_generator(target.device, seed)
    ctx = DecodeContext(target, ids, sampling, generator, tokens=ids.tolist())
    needs_features = drafter is not None and drafter.needs_features
    own = hooks(drafter) if drafter is not None else None
    accept = acceptance.acceptance(own, ctx)
    recorder, new_tokens, empty, device = MetricsRecorder(), [], Draft.empty(), target.device
    clock, cost_clock = device_clock(device), _planning_clock(device)
    if drafter is not None:
        continue_policy(target, drafter)  # a fresh drafter continues from the last of its class on this target
    policy = policy_hooks(drafter.policy) if drafter is not None else None
    gate = kept_gate(target, drafter) if gated_alone(drafter) else None  # its own lengths where they pay (batch_gate)
    if policy is not None:
        recorder.calibration_seconds = _bind_costs(policy, target, ids, clock)
    started = clock()  # after the one-time cost measurement, which the metrics keep apart
    tracer = TraceRecorder.start(clock, started, device, keep_passes=trace)
    if drafter is not None:
        drafter.begin(ctx)  # before the reset: a drafter may run the target itself while it begins
    target.reset()
    pending = ids.to(device)
    try:
        while len(new_tokens) < max_new_tokens:
            remaining = max_new_tokens - len(new_tokens)
            t0 = clock()
            c0 = cost_clock() if cost_clock is not None else t0
            draft = _propose(drafter, ctx, remaining, empty, gate, steady=len(pending) == 1)
            t1 = clock()
            c1 = cost_clock() if cost_clock is not None else t1
            start = target.cached_length
            out = target.forward(pending, draft, features=needs_features)
            accepted, next_token = _verified(accept, drafter, draft, out.logits, sampling, generator)
            target.commit(accepted)
            t2 = clock()
            c2 = cost_clock() if cost_clock is not None else t2
            depth = _depth(draft)
            recorder.record_pass(depth, len(accepted), t1 - t0, t2 - t1, proposed_tokens=len(draft),
                                 catch_up_seconds=draft.catch_up_seconds,
                                 verified_depth=draft.verified_depth(accepted) if depth else 0)
            committed = [*_tokens_at(draft.tokens, accepted), next_token]
            kept, finished = truncate(committed, remaining, target.eos_token_ids)
            tracer.record(draft.tokens, draft.parents, accepted, next_token, len(kept), t1 - t0, t2 - t1, t2)
            new_tokens += kept
            ctx.tokens += kept
            if finished:
                break
            if drafter is not None:
                if len(pending) == 1 and draft.side is None:  # not the prefill nor side rows: a pass the policy plans
                    policy.timed(len(draft), c2 - c1)
                _report(drafter.policy, draft, depth, accepted, t1 - t0, t2 - t1, asked=draft is not empty)
                drafter.observe(_outcome(draft, accepted, committed, out.features, len(pending), start, out.logits,
                                         out.side_logits))
            if gate is not None and len(pending) == 1:  # a steady pass, whole: proposal, verification, observation
                gate.record(1, draft is not empty, len(accepted) + 1, (cost_clock or clock)() - c0)
            pending = torch.tensor([next_token], dtype=torch.long, device=device)
    finally:
        if own is not None:
            own.end()
    lossy = bool(drafter is not None and drafter.lossy)
    note = "; ".join(filter(None, [policy.describe() if policy is not None else "",
                                    gate.describe() if gate is not None else ""]))
    metrics = recorder.finish(len(new_tokens), clock() - started, lossy=lossy, policy_note=note)
    metrics, passes = tracer.finish(metrics)
    return GenerationResult(new_tokens, metrics, lossy, passes)


def _verified(accept, drafter: Drafter | None, draft: Draft, logits: torch.Tensor, sampling: SamplingConfig,
              generator: torch.Generator) -> tuple[list[int], int]:
    """``accept``'s verdict on the draft; a q the verifier refuses is reported with the drafter that proposed it."""
    try:
        return accept(draft, logits, sampling, generator)
    except DraftProbabilityError as err:
        raise DraftProbabilityError(f"{drafter_name(drafter)}: {err}") from err


def _planning_clock(device: torch.device) -> Callable[[], float] | None:
    """The clock the policy's pass times are read with: CPU time on a one-thread CPU run (as the cost curve is timed:
    immune to busy neighbours); None elsewhere, where it is the loop's own clock."""
    cost_clock = process_clock(device)
    return cost_clock if cost_clock is time.process_time else None


def _bind_costs(policy: BoundHooks, target: Target, ids: torch.Tensor, clock) -> float:
    """Give a cost-aware policy (one with ``bind`` and no curve yet) the target's measured verify-cost curve;
    the seconds it took (0 when nothing was measured: the curve is measured once per target)."""
    bind = policy.bind
    if bind is None:
        return 0.0
    start = clock()
    bind(target_cost_curve(target, ids.tolist()))
    return clock() - start


def _report(policy, draft: Draft, depth: int, accepted: list[int], draft_seconds: float, verify_seconds: float,
            asked: bool = False) -> None:
    """Tell the policy about one verification: this pass's own c (one draft step, catch-up left out, over this
    verification) and its catch-up over it (the policy tells a steady backlog from an idle stretch's). ``asked``: the
    drafter was asked for a draft; one that came back empty reports its proposal's time over the pass as c."""
    c = overhead = None
    if depth and verify_seconds > 0:
        c = max(0.0, draft_seconds - draft.catch_up_seconds) / depth / verify_seconds
        overhead = draft.catch_up_seconds / verify_seconds
    elif asked and verify_seconds > 0:
        c = draft_seconds / verify_seconds
    verified = draft.verified_depth(accepted) if depth else 0
    policy.update(depth, len(accepted), c, tokens=len(draft), verified=verified, overhead=overhead)


def _tokens_at(tokens: torch.Tensor | None, nodes: list[int]) -> list[int]:
    """A draft's ``tokens`` at ``nodes``, as ints (``tokens`` may be None when ``nodes`` is empty)."""
    if not nodes:
        return []
    tokens = tokens.tolist()
    return [tokens[i] for i in nodes]


def _depth(draft: Draft) -> int:
    """Proposed depth of a draft: its length for a chain, its deepest level for a tree."""
    if len(draft) == 0:
        return 0
    return len(draft) if draft.is_chain else int(draft.depths().max())
