"""The comparison runner: every drafter and plain decoding on every prompt, measured in one run.

For each prompt in order, every arm (plain decoding first) runs it, so drift hits all arms alike and speedup is a
ratio within one run. Finished prompts are appended to the results file at once; a drafter that raises is recorded
as failed and dropped; a rerun in the same folder skips what is finished. Under torchrun each rank takes a shard.

A chat prompt is one record per turn (ids ``81``, ``81:turn2``, ...), each arm asking turn t after its own answers
to the earlier turns. Plain decoding is re-timed on the shard's first prompt through the run (``repeats.jsonl``,
:mod:`specfamily.eval.noise`).
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from specfamily.core.types import SamplingConfig
from specfamily.eval.batched import ArmSteps, run_batched_arms
from specfamily.eval.batching import BatchSettings
from specfamily.eval.config import ConfigError, DrafterSpec, check_config, sampling_config, sampling_label
from specfamily.eval.datasets import DatasetSpec, Prompt, load_prompt_set, turn_prompt_ids
from specfamily.eval.models import load_model_target, load_model_tokenizer, pick_device
from specfamily.eval.noise import NoiseSettings, record_noise
from specfamily.eval.pieces import token_pieces
from specfamily.eval.repeats import PlainRepeats
from specfamily.eval.results import FailureRecord, PromptRecord, Record, ResultWriter, consolidate, read_run
from specfamily.eval.results import results_path as rank_results_path
from specfamily.eval.start import RunPlan, is_finished, start_run
from specfamily.io.chat import answer_text, turn_id
from specfamily.train import distributed
from specfamily.zoo import NoWeights

log = logging.getLogger(__name__)


@dataclass
class Arm:
    """One drafter (or plain decoding) during a run."""

    spec: DrafterSpec
    drafter: Any = None  # None: plain decoding, or not built yet
    gamma: int | None = None
    failed: bool = False

    @property
    def label(self) -> str:
        return self.spec.label


@dataclass
class RunOutcome:
    """What a run leaves: its folder and, on rank 0, every record of the folder."""

    out_dir: Path
    rank: int
    records: list[Record] = field(default_factory=list)
    table: str = ""  # the report's Markdown table (rank 0)
    drafters: list[str] = field(default_factory=list)  # the labels of the run's drafter arms (not plain decoding)

    @property
    def failed_drafters(self) -> list[str]:
        """The drafter arms with a failure record (dropped while being built, warming up or generating)."""
        failed = {record.drafter for record in self.records if isinstance(record, FailureRecord)}
        return [label for label in self.drafters if label in failed]

    @property
    def every_drafter_failed(self) -> bool:
        """True when the run had drafter arms and every one of them failed (rank 0, which holds the records)."""
        return bool(self.drafters) and self.failed_drafters == self.drafters


def _failure(
    arm: Arm, stage: str, err: BaseException, rank: int, prompt: Prompt | None = None, turn: int = 1
) -> FailureRecord:
    log.warning("drafter %s failed while %s: %s: %s", arm.label, stage, type(err).__name__, err)
    return FailureRecord(
        drafter=arm.label,
        stage=stage,
        error=f"{type(err).__name__}: {err}",
        traceback="".join(traceback.format_exception(type(err), err, err.__traceback__)),
        prompt_id=None if prompt is None else turn_id(prompt.id, turn),
        index=None if prompt is None else prompt.index,
        rank=rank,
    )


def _build(arm: Arm, target, writer: ResultWriter, rank: int) -> None:
    """Create the arm's drafter; a drafter that cannot be built is recorded as failed."""
    if arm.spec.plain:
        return
    from specfamily.core.plugins import create_drafter
    from specfamily.core.policy import AutoPolicy

    try:
        arm.drafter = create_drafter(arm.spec.name, target, **arm.spec.options)
        # the draft length it starts from, for the records; None for a cost-aware one, whose lengths change pass by
        # pass (the report then predicts from the draft tokens it actually fed)
        policy = getattr(arm.drafter, "policy", None)
        arm.gamma = None if isinstance(policy, AutoPolicy) else getattr(policy, "gamma", arm.spec.options.get("gamma"))
    except Exception as err:  # a drafter's failure is a result; the others go on
        if arm.spec.optional and isinstance(err, NoWeights):  # drafter=all runs what this target has weights for
            log.warning("drafter=all leaves %s out: %s", arm.label, err)
        else:
            writer.write(_failure(arm, "create", err, rank))
        arm.failed = True


def _generate(plan: RunPlan, arm: Arm, ids: list[int], max_new_tokens: int, seed: int, drafter: Any = None,
              trace: bool = False):
    import specfamily as sf

    drafter = arm.drafter if drafter is None else drafter
    return sf.generate(plan.target, drafter, ids, max_new_tokens, plan.sampling, seed=seed, trace=trace)


def _warm_up(plan: RunPlan, arm: Arm, prompt: Prompt, writer: ResultWriter) -> None:
    """Untimed generations on a drafter object of their own: a drafter that learns across requests (suffix's global
    cache, the cost-aware policy's estimates) starts the timed prompts as it would start any run, not primed with
    the first prompt's answer."""
    from specfamily.core.plugins import create_drafter

    for _ in range(plan.warmup):
        try:
            warm = None if arm.spec.plain else create_drafter(arm.spec.name, plan.target, **arm.spec.options)
            _generate(plan, arm, prompt.ids, plan.warmup_tokens, plan.seed + prompt.index, drafter=warm)
        except Exception as err:
            writer.write(_failure(arm, "warmup", err, plan.info.rank, prompt))
            _drop(arm, plan)
            return


def _drop(arm: Arm, plan: RunPlan) -> None:
    """Give up on a drafter that raised; the target may be mid-pass, so reset it for the others."""
    arm.failed, arm.drafter = True, None
    plan.target.reset()


def run_prompt(plan: RunPlan, arm: Arm, prompt: Prompt, turn: int = 1, ids: list[int] | None = None) -> PromptRecord:
    """One arm on one turn of a prompt (``ids``: that turn's prompt, turn 1's by default), timed.

    Every turn of a prompt uses the prompt's seed (``seed + index``).
    """
    ids = prompt.ids if ids is None else ids
    seed = plan.seed + prompt.index
    start = time.perf_counter()
    result = _generate(plan, arm, ids, plan.dataset.max_new_tokens, seed, trace=plan.trace)
    wall = time.perf_counter() - start
    tokenizer = plan.target.tokenizer
    return PromptRecord(
        drafter=arm.label,
        dataset=plan.dataset.name,
        sampling=sampling_label(plan.sampling),
        prompt_id=turn_id(prompt.id, turn),
        index=prompt.index,
        seed=seed,
        gamma=arm.gamma,
        prompt_tokens=len(ids),
        tokens=list(result.tokens),
        wall_seconds=wall,
        lossy=bool(result.lossy),
        metrics=result.metrics.as_dict(),
        rank=plan.info.rank,
        category=prompt.category,
        turn=turn,
        prompt=None if tokenizer is None else tokenizer.decode(list(ids)),
        text=None if tokenizer is None else tokenizer.decode(list(result.tokens)),
        trace=None if result.trace is None else result.trace.as_dict(),
        pieces=None if tokenizer is None or result.trace is None else token_pieces(tokenizer, result.tokens),
    )


def _turns_left(label: str, prompt: Prompt, done: dict[tuple[str, str], PromptRecord]) -> int:
    return sum((label, turn_id(prompt.id, t)) not in done for t in range(1, prompt.n_turns + 1))


@dataclass
class _Work:
    """The state of ``run_arms``: finished records (by key), turns left per arm, the writer and the progress bar."""

    plan: RunPlan
    done: dict[tuple[str, str], PromptRecord]
    left: dict[str, int]
    writer: ResultWriter
    bar: Any = None


def _run_turns(work: _Work, arm: Arm, prompt: Prompt) -> None:
    """Every turn of ``prompt`` the arm has not finished; turn t is asked after the arm's own answers."""
    plan, answers = work.plan, []
    for turn in range(1, prompt.n_turns + 1):
        record = work.done.get((arm.label, turn_id(prompt.id, turn)))
        if record is None:
            work.left[arm.label] -= 1
            try:
                ids = turn_prompt_ids(plan.dataset, prompt, answers, plan.target.tokenizer)
                record = run_prompt(plan, arm, prompt, turn, ids)
                work.writer.write(record)
            except Exception as err:
                work.writer.write(_failure(arm, "generate", err, plan.info.rank, prompt, turn))
                _drop(arm, plan)
                work.bar.total -= work.left[arm.label]
                work.bar.update(1)
                return
            work.bar.update(1)
        if turn < prompt.n_turns:
            answers.append(answer_text(plan.target.tokenizer, record.tokens))


def run_arms(plan: RunPlan, arms: list[Arm], prompts: list[Prompt], writer: ResultWriter) -> None:
    """Build, warm up and run every arm that has work left on ``prompts`` (this rank's shard)."""
    done = {r.key: r for r in read_run(plan.out_dir) if isinstance(r, PromptRecord)}
    todo = {arm.label: [p for p in prompts if _turns_left(arm.label, p, done)] for arm in arms}
    busy = [arm for arm in arms if todo[arm.label]]
    for arm in busy:
        _build(arm, plan.target, writer, plan.info.rank)
        if not arm.failed:
            _warm_up(plan, arm, todo[arm.label][0], writer)
    live = [arm for arm in busy if not arm.failed]
    left = {arm.label: sum(_turns_left(arm.label, p, done) for p in todo[arm.label]) for arm in live}
    repeats = PlainRepeats.schedule_for(plan, prompts)
    from tqdm.auto import tqdm

    show = plan.progress and plan.info.is_main
    with tqdm(total=sum(left.values()), desc="prompts x drafters to run", disable=not show) as bar:
        work = _Work(plan, done, left, writer, bar)
        try:
            for position, prompt in enumerate(prompts):
                for arm in live:
                    if not arm.failed and _turns_left(arm.label, prompt, done):
                        _run_turns(work, arm, prompt)
                repeats.after(position)
        finally:
            repeats.writer.close()


def run_experiment(cfg: DictConfig, out_dir: Path | str) -> RunOutcome:
    """Run the comparison ``cfg`` describes into ``out_dir`` (rank 0's folder under torchrun)."""
    specs = check_config(cfg)  # the whole config, before anything loads (as the command line does)
    NoiseSettings.from_config(cfg.get("noise"))
    if BatchSettings.from_config(cfg).batched and distributed.env_world()[1] > 1:
        raise ConfigError("batch_size/arrival_rate: a batched run is one process (the batch is the load); run it "
                          "without torchrun")
    dataset = DatasetSpec.from_config(cfg.dataset)
    sampling: SamplingConfig = sampling_config(cfg.sampling)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    device = pick_device(cfg.model.get("device"), distributed.env_world()[2])
    info = distributed.setup(device.type == "cuda")
    try:
        if cfg.get("threads") is not None:
            torch.set_num_threads(int(cfg.get("threads")))
        elif info.distributed and device.type == "cpu":
            torch.set_num_threads(1)  # one thread per rank: the ranks share the cores
        out_dir = Path(distributed.broadcast(info, str(out_dir)))
        labels, plots = [spec.label for spec in specs], bool(cfg.get("plots", True))
        drafters = [spec.label for spec in specs if not spec.plain]
        if distributed.broadcast(info, info.is_main and is_finished(out_dir, specs, resolved)):
            log.info("%s holds this run, finished: nothing to run", out_dir)
            return _finish(out_dir, info.rank, labels, plots, drafters)
        tokenizer = load_model_tokenizer(cfg.model)
        prompts, source = load_prompt_set(dataset, tokenizer)  # a bad prompt file fails before the model loads
        target = load_model_target(cfg.model, device, tokenizer=tokenizer)
        plan = start_run(cfg, resolved, specs, dataset, sampling, target, prompts, out_dir, info, source)
        writer = ResultWriter(rank_results_path(out_dir, info.rank, info.world_size))
        try:
            arms = [Arm(spec) for spec in specs]
            if plan.batching.batched:
                run_batched_arms(plan, arms, prompts, writer, ArmSteps(_build, _failure, _drop))
            else:
                run_arms(plan, arms, distributed.shard(prompts, info), writer)
        finally:
            writer.close()
        distributed.barrier(info)
        return _finish(out_dir, info.rank, labels, plots, drafters)
    finally:
        distributed.teardown(info)


def _finish(out_dir: Path, rank: int, labels: list[str], plots: bool, drafters: list[str]) -> RunOutcome:
    """Rank 0 merges the results into one file and writes the report."""
    if rank != 0:
        return RunOutcome(out_dir, rank, drafters=drafters)
    from specfamily.eval.report import write_report

    records = consolidate(out_dir, labels)
    record_noise(out_dir)
    report = write_report(out_dir, plots=plots)
    log.info("results in %s (%s)", out_dir, datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return RunOutcome(out_dir, rank, records, report.table, drafters)
