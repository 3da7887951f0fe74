"""Starting (or resuming) a run in a folder: the resume check, the verify-cost measurement, ``run.json``."""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from specfamily.core.costs import CURVE_CONTEXT, measure_pass_seconds, process_clock, timing_context
from specfamily.core.target import Target
from specfamily.core.types import SamplingConfig
from specfamily.eval.batching import BatchSettings
from specfamily.eval.config import DrafterSpec, resume_fingerprint, sampling_label
from specfamily.eval.dataset_source import DatasetSource
from specfamily.eval.datasets import DatasetSpec, Prompt
from specfamily.eval.environment import (
    git_commit,
    hardware,
    package_versions,
    plugin_distributions,
    prompts_fingerprint,
    weights_hash,
)
from specfamily.eval.noise import NoiseSettings
from specfamily.eval.results import RUN_INFO, PromptRecord, RunInfo, read_run
from specfamily.train.distributed import DistInfo, broadcast

log = logging.getLogger(__name__)


@dataclass
class RunPlan:
    """Everything the runner needs once the target, the prompts and the folder are ready."""

    target: Target
    dataset: DatasetSpec
    sampling: SamplingConfig
    out_dir: Path
    info: DistInfo
    run_info: RunInfo
    seed: int = 0
    warmup: int = 1
    warmup_tokens: int = 16
    progress: bool = True
    plots: bool = True
    trace: bool = True  # keep every pass's trace in the records
    noise: NoiseSettings = NoiseSettings()
    batching: BatchSettings = BatchSettings()  # batch 1 (sf.generate per prompt) or the batched arm


def _resume_error(folder: Path, resolved: dict[str, Any]) -> str | None:
    """Why ``folder`` cannot be resumed with this config (None when it can, or holds no run)."""
    if not (folder / RUN_INFO).is_file():
        return None
    old = resume_fingerprint(RunInfo.load(folder).config)
    new = resume_fingerprint(resolved)
    changed = [key for key in new if old.get(key) != new[key]]
    if not changed:
        return None
    return (
        f"{folder} holds a run with a different {', '.join(changed)} config; resume it with the same config "
        "or write to a new folder (hydra.run.dir=...)"
    )


def is_finished(folder: Path, specs: list[DrafterSpec], resolved: dict[str, Any]) -> bool:
    """Whether ``folder`` holds this very run with every arm finished on every prompt."""
    if not (folder / RUN_INFO).is_file() or _resume_error(folder, resolved) is not None:
        return False
    prompts = RunInfo.load(folder).prompts
    counts = Counter(r.drafter for r in read_run(folder) if isinstance(r, PromptRecord))
    return prompts > 0 and all(counts[spec.label] >= prompts for spec in specs)


@dataclass
class CostMeasurement:
    """The verify-cost curve (median of the rounds) and each round's median pass seconds by draft tokens g."""

    curve: dict[str, float]
    rounds: list[dict[str, float]]


def cost_curve(rounds: list[dict[int, float]]) -> dict[int, float]:
    """t(g + 1) / t(1) of each round, then the median over the rounds for each g."""
    sizes = sorted(set.intersection(*(set(r) for r in rounds)))
    return {g: statistics.median(r[g] / r[0] for r in rounds) for g in sizes}


def _verify_cost(cfg: DictConfig, target: Target, prompts: list[Prompt], rounds: int) -> CostMeasurement:
    """Time the target's passes ``rounds`` times (the spread is a noise check) and hand the curve to the target."""
    node = cfg.get("verify_cost")
    if node is None or not node.get("measure", True) or not prompts:
        return CostMeasurement({}, [])
    sizes, repeats = list(node.get("sizes", [0, 1, 2, 4, 8])), int(node.get("repeats", 5))
    context = timing_context(target, prompts[0].ids, int(node.get("context", CURVE_CONTEXT)), sizes, repeats)
    try:
        timed = [measure_pass_seconds(target, context, sizes, repeats, process_clock(target.device))
                 for _ in range(rounds)]
    except ValueError as err:
        log.warning("verify cost not measured: %s", err)
        return CostMeasurement({}, [])
    curve = cost_curve(timed)
    target.verify_costs = curve  # the cost-aware drafters size their drafts with this very curve
    return CostMeasurement({str(g): c for g, c in curve.items()}, [{str(g): s for g, s in r.items()} for r in timed])


def _reused_cost(old: RunInfo, target: Target) -> CostMeasurement:
    """A resumed run's own verify-cost curve, handed to the target for the cost-aware drafters too."""
    target.verify_costs = {int(g): float(cost) for g, cost in old.verify_cost.items()}
    return CostMeasurement(old.verify_cost, old.pass_seconds)


def _run_info(cfg, resolved, specs, dataset, sampling, target, prompts, out_dir, info, source=None) -> RunInfo:
    old = RunInfo.load(out_dir) if (out_dir / RUN_INFO).is_file() else None
    rounds = NoiseSettings.from_config(cfg.get("noise")).cost_rounds
    cost = _reused_cost(old, target) if old and old.verify_cost else _verify_cost(cfg, target, prompts, rounds)
    return RunInfo(
        config=resolved,
        seed=int(cfg.get("seed", 0)),
        dataset=dataset.name,
        sampling=sampling_label(sampling),
        drafters=[spec.label for spec in specs],
        prompts=sum(prompt.n_turns for prompt in prompts),  # records per arm: one per turn
        max_new_tokens=dataset.max_new_tokens,
        world_size=info.world_size,
        device=str(target.device),
        threads=torch.get_num_threads(),
        versions=package_versions(),
        git=git_commit(),
        verify_cost=cost.curve,
        started=old.started if old else datetime.now(timezone.utc).isoformat(timespec="seconds"),
        plugins=plugin_distributions(),
        weights=weights_hash(target.model),
        dataset_fingerprint=prompts_fingerprint(prompts),
        hardware=hardware(target.device),
        pass_seconds=cost.rounds,
        matmul=target.matmul,
        matmul_seconds=dict(target.matmul_choice.seconds),
        dataset_source=None if source is None else source.as_dict(),
    )


def start_run(
    cfg: DictConfig,
    resolved: dict[str, Any],
    specs: list[DrafterSpec],
    dataset: DatasetSpec,
    sampling: SamplingConfig,
    target: Target,
    prompts: list[Prompt],
    out_dir: Path,
    info: DistInfo,
    dataset_source: DatasetSource | None = None,
) -> RunPlan:
    """Rank 0 checks the folder, measures the verify cost once and writes ``run.json``; every rank gets it.

    ``dataset_source``: where the prompts came from (revision, fingerprint), kept in ``run.json``."""
    payload: tuple[RunInfo | None, str | None] = (None, None)
    if info.is_main:
        error = _resume_error(out_dir, resolved)
        if error is None:
            run_info = _run_info(cfg, resolved, specs, dataset, sampling, target, prompts, out_dir, info,
                                 dataset_source)
            run_info.save(out_dir)
            payload = (run_info, None)
        else:
            payload = (None, error)
    run_info, error = broadcast(info, payload)
    if error is not None:
        raise ValueError(error)
    if not info.is_main and run_info.verify_cost:  # every rank's drafters size their drafts with rank 0's curve
        _reused_cost(run_info, target)
    return RunPlan(
        target=target,
        dataset=dataset,
        sampling=sampling,
        out_dir=out_dir,
        info=info,
        run_info=run_info,
        seed=int(cfg.get("seed", 0)),
        warmup=int(cfg.get("warmup", 1)),
        warmup_tokens=int(cfg.get("warmup_tokens", 16)),
        progress=bool(cfg.get("progress", True)),
        plots=bool(cfg.get("plots", True)),
        trace=bool(cfg.get("trace", True)),
        noise=NoiseSettings.from_config(cfg.get("noise")),
        batching=BatchSettings.from_config(cfg),
    )
