"""The runner's batched arm: every arm (plain decoding first) decodes the prompt set through ``sf.generate_batch``.

Each arm makes one ``generate_batch`` call per turn (turn t of every prompt that has one, after the arm's own
answers to the earlier turns), ``max_batch = batch_size``, the requests arriving at the seeded Poisson times of
:func:`specfamily.eval.batching.poisson_arrivals` (every arm sees the same arrivals) or all at once. Arms run one
after the other, each on the whole prompt set (a batched call is the unit that is timed); plain decoding, the first,
rehearses its calls untimed before it is timed.

``results.jsonl`` keeps one :class:`PromptRecord` per request; its ``batch`` field holds the call's size, wall and
CPU seconds, and the request's arrival, first-token and finish times (seconds from the call's start), latency, time
to first token and tokens/s, as the batched loop measured them. ``wall_seconds`` is the request's latency (finish -
arrival); ``trace`` and ``pieces`` are kept as the batch-1 path keeps them. Request i of a call draws
from a generator seeded ``seed + i`` (its position in the call; the record's ``seed``), so sampled text is not
the batch-1 run's; greedy text is. A rerun in the same folder redoes a call that did not finish whole.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from specfamily.eval.batching import RequestTiming, poisson_arrivals
from specfamily.eval.config import sampling_label
from specfamily.eval.datasets import Prompt, turn_prompt_ids
from specfamily.eval.pieces import token_pieces
from specfamily.eval.results import PromptRecord, ResultWriter, read_run
from specfamily.eval.start import RunPlan
from specfamily.io.chat import answer_text, turn_id

NAN = float("nan")


@dataclass(frozen=True)
class ArmSteps:
    """The runner's own steps on an arm (:mod:`specfamily.eval.runner`), handed in so that this module does not import
    the runner: build its drafter (recording a failure), make a failure record, drop a failed arm."""

    build: Callable[[Any, Any, ResultWriter, int], None]  # (arm, target, writer, rank)
    failure: Callable[..., Any]  # (arm, stage, err, rank, prompt=None, turn=1) -> FailureRecord
    drop: Callable[[Any, RunPlan], None]  # (arm, plan)


@dataclass
class Call:
    """One arm's batched call: the requests (prompt, turn, ids) and the arrivals it was given."""

    turn: int
    prompts: list[Prompt]
    ids: list[list[int]]
    arrivals: list[float] | None


def request_timing(result: Any) -> RequestTiming:
    """A request's times in its call, as the batched loop reports them (``arrival_s``, ``first_token_s``,
    ``finish_s`` on its metrics: seconds since the call; the latency includes the time it waited for a slot)."""
    m = result.metrics
    return RequestTiming(m.arrival_s, m.first_token_s, m.finish_s)


def _generate_batch(plan: RunPlan, drafter: Any, ids: list[list[int]], max_new_tokens: int,
                    arrivals: list[float] | None, trace: bool = False) -> list:
    import specfamily as sf

    return sf.generate_batch(plan.target, drafter, ids, max_new_tokens, plan.sampling, seed=plan.seed,
                             max_batch=plan.batching.batch_size, arrivals=arrivals, trace=trace)


def _warm_up(plan: RunPlan, arm: Any, prompts: list[Prompt], writer: ResultWriter, steps: ArmSteps) -> None:
    """Untimed batched generations (up to ``batch_size`` requests, all at once) on a drafter of their own; plain
    decoding then rehearses its calls (:func:`_rehearse`)."""
    from specfamily.core.plugins import create_drafter

    ids = [p.ids for p in prompts[: plan.batching.batch_size]]
    try:
        for _ in range(plan.warmup):
            warm = None if arm.spec.plain else create_drafter(arm.spec.name, plan.target, **arm.spec.options)
            _generate_batch(plan, warm, ids, plan.warmup_tokens, None)
        if arm.spec.plain and plan.warmup > 0:
            _rehearse(plan, prompts)
    except Exception as err:
        writer.write(steps.failure(arm, "warmup", err, plan.info.rank, prompts[0]))
        steps.drop(arm, plan)


def _rehearse(plan: RunPlan, prompts: list[Prompt]) -> None:
    """Plain decoding's calls once, untimed and all at once, before they are timed: the arms run one after the other
    and plain decoding first, so it met every prompt's shapes first and read 3-8% slower than the same decoding run
    after the drafters, which lifted every speedup by as much (docs/batching-log.md, session 38)."""
    answers: dict[str, list[str]] = {p.id: [] for p in prompts}
    for turn, asked in _turns(prompts):
        ids = _call(plan, turn, asked, answers).ids
        for prompt, result in zip(asked, _generate_batch(plan, None, ids, plan.dataset.max_new_tokens, None),
                                  strict=True):
            answers[prompt.id].append(answer_text(plan.target.tokenizer, result.tokens))


def _record(plan: RunPlan, arm: Any, call: Call, i: int, result: Any, wall: float, cpu: float) -> PromptRecord:
    prompt, ids, tokenizer = call.prompts[i], call.ids[i], plan.target.tokenizer
    timing = request_timing(result)
    new_tokens = len(result.tokens)
    batch = {"size": plan.batching.batch_size, "arrival_rate": plan.batching.arrival_rate, "requests":
             len(call.prompts), "call_wall_seconds": wall, "call_cpu_seconds": cpu, "arrival_s": timing.arrival,
             "first_token_s": _finite(timing.first_token), "finish_s": timing.finish, "latency_s": timing.latency,
             "ttft_s": _finite(timing.ttft), "tokens_per_second": _finite(timing.tokens_per_second(new_tokens))}
    return PromptRecord(
        drafter=arm.label, dataset=plan.dataset.name, sampling=sampling_label(plan.sampling),
        prompt_id=turn_id(prompt.id, call.turn), index=prompt.index, seed=plan.seed + i, gamma=arm.gamma,
        prompt_tokens=len(ids), tokens=list(result.tokens), wall_seconds=timing.latency, lossy=bool(result.lossy),
        metrics=result.metrics.as_dict(), rank=plan.info.rank, category=prompt.category, turn=call.turn,
        prompt=None if tokenizer is None else tokenizer.decode(list(ids)),
        text=None if tokenizer is None else tokenizer.decode(list(result.tokens)), batch=batch,
        trace=None if result.trace is None else result.trace.as_dict(),
        pieces=None if tokenizer is None or result.trace is None else token_pieces(tokenizer, result.tokens),
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run_call(plan: RunPlan, arm: Any, call: Call) -> list[PromptRecord]:
    """One timed batched call: a record per request, in the call's order."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    results = _generate_batch(plan, arm.drafter, call.ids, plan.dataset.max_new_tokens, call.arrivals, plan.trace)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return [_record(plan, arm, call, i, result, wall, cpu) for i, result in enumerate(results)]


def _turns(prompts: list[Prompt]) -> Iterator[tuple[int, list[Prompt]]]:
    """Each turn of the prompt set in order, with the prompts that have it."""
    for turn in range(1, max(p.n_turns for p in prompts) + 1):
        yield turn, [p for p in prompts if p.n_turns >= turn]


def _call(plan: RunPlan, turn: int, prompts: list[Prompt], answers: dict[str, list[str]]) -> Call:
    ids = [turn_prompt_ids(plan.dataset, p, answers[p.id], plan.target.tokenizer) for p in prompts]
    return Call(turn, prompts, ids, poisson_arrivals(len(prompts), plan.batching.arrival_rate, plan.seed + turn))


def _run_arm(plan: RunPlan, arm: Any, prompts: list[Prompt], writer: ResultWriter,
             done: dict[tuple[str, str], PromptRecord], steps: ArmSteps) -> None:
    """Every turn of the arm, one call per turn; a turn whose records are all there is kept as it is."""
    answers: dict[str, list[str]] = {p.id: [] for p in prompts}
    for turn, asked in _turns(prompts):
        kept = [done.get((arm.label, turn_id(p.id, turn))) for p in asked]
        if any(record is None for record in kept):
            try:
                kept = run_call(plan, arm, _call(plan, turn, asked, answers))
            except Exception as err:  # a drafter's failure is a result; the other arms go on
                writer.write(steps.failure(arm, "generate", err, plan.info.rank, asked[0], turn))
                steps.drop(arm, plan)
                return
            for record in kept:
                writer.write(record)
        for prompt, record in zip(asked, kept, strict=True):
            answers[prompt.id].append(answer_text(plan.target.tokenizer, record.tokens))


def run_batched_arms(plan: RunPlan, arms: list, prompts: list[Prompt], writer: ResultWriter, steps: ArmSteps) -> None:
    """Build, warm up and run every arm (the runner's ``Arm``) through ``generate_batch``, arm after arm (plain
    decoding first)."""
    if not prompts:
        return
    done = {r.key: r for r in read_run(plan.out_dir) if isinstance(r, PromptRecord)}
    for arm in arms:
        if all((arm.label, turn_id(p.id, t)) in done for p in prompts for t in range(1, p.n_turns + 1)):
            continue
        steps.build(arm, plan.target, writer, plan.info.rank)
        if not arm.failed:
            _warm_up(plan, arm, prompts, writer, steps)
        if not arm.failed:
            _run_arm(plan, arm, prompts, writer, done, steps)
