"""From per-prompt records to one row per drafter and run: tau, alpha, speedup, predicted speedup.

Speedup is throughput (new tokens per second of ``sf.generate`` wall time) relative to plain
decoding over the prompts both finished in the same run. The prediction (:func:`modelled_speedup`) puts the
acceptance model's tokens per pass (from the measured alpha, the draft length gamma and the share of passes that
drafted) on the run's own costs: the drafter's measured prefills and mean pass time. ``verify_cost`` is what a
drafted pass cost relative to a plain one in the run (:func:`measured_verify_cost`). Results recorded before runs
timed their passes use ``sf.theory.expected_speedup(alpha, gamma, c * V, V)`` with V the cost curve at the draft
tokens fed per pass.

Each row also carries bootstrap 95% intervals of tau and speedup over prompts
(:mod:`specfamily.eval.stats`) and, for greedy runs, how many prompts' tokens are identical to
plain decoding's (on a GPU, bf16 can flip near-ties, so this is a share, not a pass/fail).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from specfamily.core import theory
from specfamily.core.costs import verify_cost_at
from specfamily.eval.config import PLAIN, RUN_LABEL
from specfamily.eval.results import FailureRecord, PromptRecord, Record, RunInfo
from specfamily.eval.stats import NO_INTERVAL, Interval, ratio_interval, speedup_interval

NAN = float("nan")


@dataclass
class SummaryRow:
    """One drafter (or plain decoding) in one run."""

    run: str  # the run's label (a sweep job: its overrides), else its folder relative to the report folder (".")
    dataset: str
    sampling: str
    drafter: str
    gamma: int | None
    status: str  # ok | partial (not every prompt finished yet) | failed
    prompts: int
    new_tokens: int
    tau: float  # new tokens / target passes
    alpha: float  # mean per-prompt acceptance rate
    draft_acceptance: float  # accepted / proposed draft tokens
    c: float  # median per-prompt c: one draft step / one verification pass
    draft_tokens_per_pass: float
    seconds: float
    tokens_per_second: float
    speedup: float
    verify_cost: float  # a drafted pass / a plain pass, measured in the run (older results: the curve at n fed)
    predicted_speedup: float
    lossy: bool
    per_position: list[float] = field(default_factory=list)  # cumulative: P(accepted length > i), mean over prompts
    error: str = ""
    tau_low: float = NAN  # bootstrap 95% interval over prompts
    tau_high: float = NAN
    speedup_low: float = NAN
    speedup_high: float = NAN
    identical: int | None = None  # prompts whose tokens equal plain decoding's (greedy runs; None otherwise)
    compared: int = 0  # prompts compared with plain decoding
    drafted: float = NAN  # share of the passes after each prefill that verified a draft
    policy_note: str = ""  # the draft-length policy's account at the end of the run (cost-aware: why it drafts or not)
    conditional: list[float] = field(default_factory=list)  # i: acceptance where depth i + 1 was tried (prompt mean)

    @property
    def tau_ci(self) -> Interval:
        return Interval(self.tau_low, self.tau_high)

    @property
    def speedup_ci(self) -> Interval:
        return Interval(self.speedup_low, self.speedup_high)


def _finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _mean(values: Iterable[float | None]) -> float:
    values = _finite(values)
    return statistics.fmean(values) if values else NAN


def _median(values: Iterable[float | None]) -> float:
    values = _finite(values)
    return statistics.median(values) if values else NAN


def _throughput(records: list[PromptRecord]) -> float:
    seconds = sum(r.wall_seconds for r in records)
    return sum(r.metrics["new_tokens"] for r in records) / seconds if seconds > 0 else NAN


def speedup(records: list[PromptRecord], plain: list[PromptRecord]) -> float:
    """Throughput ratio to plain decoding over the prompts both finished."""
    shared = {r.prompt_id for r in records} & {r.prompt_id for r in plain}
    if not shared:
        return NAN
    mine = _throughput([r for r in records if r.prompt_id in shared])
    base = _throughput([r for r in plain if r.prompt_id in shared])
    return mine / base if base > 0 else NAN


def _by_prompt(records: list[PromptRecord]) -> list[list[PromptRecord]]:
    """Records grouped by prompt (a question's turns together: the unit the bootstrap resamples)."""
    groups: dict[int, list[PromptRecord]] = {}
    for record in records:
        groups.setdefault(record.index, []).append(record)
    return list(groups.values())


def tau_interval(records: list[PromptRecord]) -> Interval:
    """Bootstrap interval of tau (new tokens / target passes) over prompts."""
    groups = _by_prompt(records)
    return ratio_interval([sum(r.metrics["new_tokens"] for r in g) for g in groups],
                          [sum(r.metrics["target_passes"] for r in g) for g in groups])


def speedup_ci(records: list[PromptRecord], plain: list[PromptRecord]) -> Interval:
    """Bootstrap interval of :func:`speedup` over the prompts both finished, paired by prompt."""
    shared = {r.prompt_id for r in records} & {r.prompt_id for r in plain}
    base = {r.prompt_id: r for r in plain}
    groups = _by_prompt([r for r in records if r.prompt_id in shared])
    if not groups:
        return NO_INTERVAL
    return speedup_interval(
        [sum(r.metrics["new_tokens"] for r in g) for g in groups], [sum(r.wall_seconds for r in g) for g in groups],
        [sum(base[r.prompt_id].metrics["new_tokens"] for r in g) for g in groups],
        [sum(base[r.prompt_id].wall_seconds for r in g) for g in groups],
    )


def identical_to_plain(records: list[PromptRecord], plain: list[PromptRecord]) -> tuple[int, int]:
    """(prompts whose new tokens equal plain decoding's, prompts compared)."""
    base = {r.prompt_id: r.tokens for r in plain}
    compared = [r for r in records if r.prompt_id in base]
    return sum(r.tokens == base[r.prompt_id] for r in compared), len(compared)


def per_position(records: list[PromptRecord], key: str = "per_position_acceptance") -> list[float]:
    """Mean acceptance at each draft depth over the prompts that drafted that deep: cumulative by default,
    ``key="conditional_acceptance"`` for the rate where each depth was tried."""
    rows = [r.metrics.get(key) or [] for r in records]
    depth = max((len(row) for row in rows), default=0)
    return [_mean(row[i] for row in rows if i < len(row)) for i in range(depth)]


def predicted_speedup(alpha: float, gamma: int | None, c: float, verify_cost: float) -> float:
    """``theory.expected_speedup`` with c rescaled to a one-token pass; nan without the inputs (results recorded
    before runs timed their own passes)."""
    if gamma is None or gamma < 1 or not all(math.isfinite(x) for x in (alpha, c, verify_cost)):
        return NAN
    alpha = min(max(alpha, 0.0), 1.0)
    return theory.expected_speedup(alpha, int(gamma), c * verify_cost, verify_cost=verify_cost)


def _fed_per_pass(records: list[PromptRecord]) -> float:
    passes = sum(max(r.metrics["target_passes"] - 1, 0) for r in records)
    return sum(r.metrics["proposed_tokens"] for r in records) / passes if passes else NAN


def _timed(records: list[PromptRecord]) -> bool:
    """Whether every record kept its prefill's time (results written before the loop kept it did not)."""
    return bool(records) and all(r.metrics.get("prefill_seconds") is not None for r in records)


def measured_verify_cost(records: list[PromptRecord], plain: list[PromptRecord]) -> float:
    """What a drafted pass cost in this run relative to a plain one: the drafter's mean verify time of a drafted pass
    over plain decoding's mean verify time of a pass after the prefill, on the prompts both finished (the pass the run
    really made: its size, mask, cache rewrite, cache lengths and sampling); nan when not recorded."""
    shared = {r.prompt_id for r in records} & {r.prompt_id for r in plain}
    mine, base = [r for r in records if r.prompt_id in shared], [r for r in plain if r.prompt_id in shared]
    drafted = sum(r.metrics.get("drafted_passes", 0) for r in mine)
    steady = sum(r.metrics["target_passes"] - 1 for r in base)
    if not (_timed(mine) and _timed(base)) or not drafted or steady <= 0:
        return NAN
    plain_pass = sum(r.metrics["verify_seconds"] - r.metrics["prefill_seconds"] for r in base) / steady
    return sum(r.metrics["drafted_verify_seconds"] for r in mine) / drafted / plain_pass if plain_pass > 0 else NAN


def modelled_speedup(records: list[PromptRecord], plain: list[PromptRecord], alpha: float, gamma: int) -> float:
    """The speedup the acceptance model predicts with this run's own costs: the drafter's measured prefills and mean
    time of a later pass (drafting, verification, the loop's own work), over as many passes as the model says its
    tokens need: share * (1 - alpha^(gamma + 1)) / (1 - alpha) + 1 - share tokens a pass (share: the passes that
    drafted). Against plain decoding's measured throughput on the same prompts; nan when not recorded."""
    shared = {r.prompt_id for r in records} & {r.prompt_id for r in plain}
    mine = [r for r in records if r.prompt_id in shared]
    share, base = drafted_share(mine), _throughput([r for r in plain if r.prompt_id in shared])
    later = sum(r.metrics["target_passes"] - 1 for r in mine)
    if not _timed(mine) or later <= 0 or not all(math.isfinite(x) for x in (alpha, share, base)):
        return NAN
    prefill = sum(r.metrics["prefill_seconds"] for r in mine)
    per_pass = (sum(r.wall_seconds for r in mine) - prefill) / later
    share = min(max(share, 0.0), 1.0)
    per_pass_tokens = share * theory.expected_tokens_per_pass(min(max(alpha, 0.0), 1.0), gamma) + 1.0 - share
    tokens = sum(r.metrics["new_tokens"] for r in mine)
    seconds = prefill + per_pass * max(tokens - len(mine), 0) / per_pass_tokens  # the prefill brings a token each
    return tokens / seconds / base if seconds > 0 else NAN


def _prediction(
    records: list[PromptRecord], plain: list[PromptRecord], info: RunInfo, alpha: float, gamma: int | None, c: float
) -> tuple[float, float, float]:
    """(draft tokens fed per pass, what a drafted pass costs, predicted speedup) of a drafter's records.

    Timed results: the run's own costs (:func:`measured_verify_cost`, :func:`modelled_speedup`; without a fixed
    gamma, the mean drafted depth). Results recorded before runs timed their passes: the run's cost curve at the
    tokens fed per pass and ``theory.expected_speedup``, every pass drafting."""
    fed = _fed_per_pass(records)
    verify = measured_verify_cost(records, plain)
    if math.isfinite(verify):
        drafted = sum(r.metrics["drafted_passes"] for r in records)
        depth = gamma if gamma is not None else max(1, round(sum(r.metrics["draft_steps"] for r in records) / drafted))
        return fed, verify, modelled_speedup(records, plain, alpha, depth)
    curve = {int(g): v for g, v in info.verify_cost.items()}
    if not curve or not math.isfinite(fed):
        return fed, NAN, NAN
    verify = verify_cost_at(curve, fed)
    return fed, verify, predicted_speedup(alpha, gamma if gamma is not None else round(fed), c, verify)


def drafted_share(records: list[PromptRecord]) -> float:
    """Passes that verified a draft over the passes after each prompt's prefill, over all prompts."""
    drafted = after = 0.0
    for record in records:
        share, passes = record.metrics.get("drafted_share"), record.metrics["target_passes"] - 1
        if share is not None and passes > 0:
            drafted, after = drafted + share * passes, after + passes
    return drafted / after if after else NAN


def _status(n_done: int, n_prompts: int, failure: FailureRecord | None) -> str:
    if n_done >= n_prompts and n_done > 0:
        return "ok"
    return "failed" if failure is not None else "partial"


def summarize(
    label: str, records: list[PromptRecord], plain: list[PromptRecord], info: RunInfo, run: str,
    failure: FailureRecord | None = None,
) -> SummaryRow:
    """The row of one drafter in one run."""
    gamma = next((r.gamma for r in records if r.gamma is not None), None)
    alpha, c = _mean(r.metrics["acceptance_rate"] for r in records), _median(r.metrics["c"] for r in records)
    fed, verify, predicted = (NAN, 1.0, 1.0) if label == PLAIN else _prediction(records, plain, info, alpha, gamma, c)
    new_tokens = sum(r.metrics["new_tokens"] for r in records)
    passes = sum(r.metrics["target_passes"] for r in records)
    status = _status(len(records), info.prompts, failure)
    identical, compared = identical_to_plain(records, plain)
    spread = NO_INTERVAL if label == PLAIN else speedup_ci(records, plain)  # plain: exactly 1
    tau_ci = tau_interval(records)
    return SummaryRow(
        run=run, dataset=info.dataset, sampling=info.sampling, drafter=label, gamma=gamma, status=status,
        prompts=len(records), new_tokens=new_tokens, tau=new_tokens / passes if passes else NAN, alpha=alpha,
        draft_acceptance=_mean(r.metrics["draft_acceptance"] for r in records), c=c, draft_tokens_per_pass=fed,
        seconds=sum(r.wall_seconds for r in records), tokens_per_second=_throughput(records),
        speedup=speedup(records, plain) if records else NAN, verify_cost=verify, predicted_speedup=predicted,
        lossy=any(r.lossy for r in records), per_position=per_position(records),
        conditional=per_position(records, "conditional_acceptance"),
        error="" if failure is None or status == "ok" else f"{failure.stage}: {failure.error}",
        tau_low=tau_ci.low, tau_high=tau_ci.high, speedup_low=spread.low, speedup_high=spread.high,
        identical=identical if info.sampling == "greedy" and label != PLAIN else None, compared=compared,
        drafted=NAN if label == PLAIN else drafted_share(records),
        policy_note=records[-1].metrics.get("policy_note", "") if records else "",
    )


def run_name(info: RunInfo, folder: str) -> str:
    """A run's name in a report: its ``run_label`` (a sweep job: its own overrides), else its folder."""
    label = info.config.get(RUN_LABEL)
    return str(label) if label else folder


def summarize_run(records: list[Record], info: RunInfo, run: str = ".") -> list[SummaryRow]:
    """One row per arm of a run, in the run's drafter order (plain decoding first), named by :func:`run_name`."""
    run = run_name(info, run)
    prompts: dict[str, list[PromptRecord]] = {}
    failures: dict[str, FailureRecord] = {}
    for record in records:
        if isinstance(record, PromptRecord):
            prompts.setdefault(record.drafter, []).append(record)
        else:
            failures[record.drafter] = record
    labels = list(dict.fromkeys([*info.drafters, *prompts, *failures]))
    plain = prompts.get(PLAIN, [])
    return [summarize(label, prompts.get(label, []), plain, info, run, failures.get(label)) for label in labels]
