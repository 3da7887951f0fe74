"""EAGLE-3 against EAGLE-1 at fixed shapes, one markdown table per run (sampling setting), from run folders.

Each run is ``specfamily model=smollm2 experiment=eagle3_vs_eagle sampling=...``: arms ``eagle:c1`` .. ``eagle:c4``
(chains of 1-4 tokens), ``eagle:tree`` (depth 4, 12 nodes) and the same five for ``eagle3``, with plain decoding.
For every shape it gives both families' tau (pooled: total new tokens / total target passes, the prefill pass
included), alpha and acceptance by depth (per-prompt ratios averaged over prompts: the records store no per-depth
proposal counts to pool them by), the speedup over the run's plain decoding (``specfamily.eval.summary.speedup``,
as the run's own report computes it: throughput over the prompts both finished), and tau(EAGLE-3) / tau(EAGLE-1)
against the goal of 1.15x at every shape.

    python benchmarks/eagle3_table.py RUN1 RUN2 --out-md docs/eagle3-smollm2.md --out-json docs/eagle3-smollm2.json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from specfamily.eval.config import PLAIN
from specfamily.eval.results import FailureRecord, PromptRecord, read_run
from specfamily.eval.summary import speedup

SHAPES = ("c1", "c2", "c3", "c4", "tree")
FAMILIES = {"eagle": "EAGLE-1", "eagle3": "EAGLE-3"}
GOAL = 1.15  # tau(EAGLE-3) / tau(EAGLE-1) at every shape


@dataclass
class ArmStats:
    """One arm (a family at a shape) in one run."""

    label: str
    prompts: int
    new_tokens: int
    target_passes: int
    tau: float  # pooled: new tokens / target passes
    alpha: float  # mean over prompts of each prompt's acceptance rate
    depth: list[float]  # d: mean over prompts of the acceptance at depth d + 1
    speedup: float  # throughput over plain decoding's, on the prompts both finished
    failure: str = ""  # the error of an arm that failed


@dataclass
class ShapeRow:
    shape: str
    eagle: ArmStats | None
    eagle3: ArmStats | None
    tau_ratio: float  # tau(EAGLE-3) / tau(EAGLE-1)
    goal_met: bool | None  # None when either tau is missing


def _finite_mean(values: list[float | None]) -> float:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else math.nan


def pooled_tau(records: list[PromptRecord]) -> float:
    """Total new tokens / total target passes over the records; nan without passes."""
    passes = sum(r.metrics["target_passes"] for r in records)
    return sum(r.metrics["new_tokens"] for r in records) / passes if passes > 0 else math.nan


def mean_alpha(records: list[PromptRecord]) -> float:
    """Each prompt's acceptance rate averaged over the prompts that have one (as the run's summary does)."""
    return _finite_mean([r.metrics["acceptance_rate"] for r in records])


def depth_acceptance(records: list[PromptRecord]) -> list[float]:
    """Acceptance at depth 1, 2, ...: each prompt's ratio averaged over the prompts that proposed that deep."""
    deepest = max((len(r.metrics["per_position_acceptance"]) for r in records), default=0)
    return [_finite_mean([r.metrics["per_position_acceptance"][d] if d < len(r.metrics["per_position_acceptance"])
                          else None for r in records]) for d in range(deepest)]


def arm_stats(label: str, records: list[PromptRecord], plain: list[PromptRecord], failure: str = "") -> ArmStats:
    return ArmStats(label, len(records), sum(r.metrics["new_tokens"] for r in records),
                    sum(r.metrics["target_passes"] for r in records), pooled_tau(records), mean_alpha(records),
                    depth_acceptance(records), speedup(records, plain) if records else math.nan, failure)


def shape_row(shape: str, eagle: ArmStats | None, eagle3: ArmStats | None) -> ShapeRow:
    """Both families at one shape, with the tau ratio and whether it reaches GOAL."""
    ratio = math.nan
    if eagle is not None and eagle3 is not None and eagle.tau > 0 and math.isfinite(eagle3.tau):
        ratio = eagle3.tau / eagle.tau
    return ShapeRow(shape, eagle, eagle3, ratio, None if math.isnan(ratio) else ratio >= GOAL)


def run_rows(folder: Path) -> tuple[str, list[ShapeRow]]:
    """(the run's sampling label, one row per shape) of a run folder's results."""
    records = read_run(folder)
    prompts = [r for r in records if isinstance(r, PromptRecord)]
    if not prompts:
        raise SystemExit(f"{folder} has no prompt results: pass the folder of an eagle3_vs_eagle run")
    failures = {r.drafter: r.error for r in records if isinstance(r, FailureRecord)}
    by_label: dict[str, list[PromptRecord]] = {}
    for record in prompts:
        by_label.setdefault(record.drafter, []).append(record)
    plain = by_label.get(PLAIN, [])
    samplings = sorted({r.sampling for r in prompts})

    def stats(label: str) -> ArmStats | None:
        if label not in by_label and label not in failures:
            return None
        return arm_stats(label, by_label.get(label, []), plain, failures.get(label, ""))

    rows = [shape_row(shape, stats(f"eagle:{shape}"), stats(f"eagle3:{shape}")) for shape in SHAPES]
    return "/".join(samplings), rows


def _num(value: float, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _depths(arm: ArmStats | None) -> str:
    return "-" if arm is None or not arm.depth else " / ".join(_num(v) for v in arm.depth)


def _cell(arm: ArmStats | None, field: str) -> str:
    if arm is None:
        return "-"
    if arm.failure and not arm.prompts:
        return "failed"
    return _num(getattr(arm, field))


def markdown(run: str, sampling: str, rows: list[ShapeRow]) -> str:
    """One run's table: a row per shape, EAGLE-1 and EAGLE-3 side by side."""
    prompts = max((arm.prompts for row in rows for arm in (row.eagle, row.eagle3) if arm is not None), default=0)
    lines = [f"### {run}: sampling {sampling} ({prompts} prompts)", "",
             "| shape | tau EAGLE-1 | tau EAGLE-3 | tau ratio | >= 1.15x | alpha EAGLE-1 | alpha EAGLE-3 "
             "| acceptance by depth EAGLE-1 (mean over prompts) | acceptance by depth EAGLE-3 (mean over prompts) "
             "| speedup EAGLE-1 | speedup EAGLE-3 |",
             "| --- | ---: | ---: | ---: | :---: | ---: | ---: | --- | --- | ---: | ---: |"]
    for row in rows:
        met = "-" if row.goal_met is None else ("yes" if row.goal_met else "no")
        lines.append(f"| {row.shape} | {_cell(row.eagle, 'tau')} | {_cell(row.eagle3, 'tau')} | "
                     f"{_num(row.tau_ratio)} | {met} | {_cell(row.eagle, 'alpha')} | {_cell(row.eagle3, 'alpha')} | "
                     f"{_depths(row.eagle)} | {_depths(row.eagle3)} | {_cell(row.eagle, 'speedup')} | "
                     f"{_cell(row.eagle3, 'speedup')} |")
    verdicts = [row.goal_met for row in rows]
    every = "yes" if all(v is True for v in verdicts) else ("no" if any(v is False for v in verdicts) else "unknown")
    lines += ["", f"EAGLE-3 tau >= {GOAL}x EAGLE-1's at every shape: {every}."]
    failed = [(arm.label, arm.failure) for row in rows for arm in (row.eagle, row.eagle3) if arm and arm.failure]
    lines += [f"- `{label}` failed: {error}" for label, error in failed]
    return "\n".join(lines) + "\n"


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="folders of eagle3_vs_eagle runs (one per sampling)")
    parser.add_argument("--out-md", default=None, help="write the tables here as markdown")
    parser.add_argument("--out-json", default=None, help="write the rows here as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tables, data = [], []
    for run in args.runs:
        folder = Path(run)
        sampling, rows = run_rows(folder)
        tables.append(markdown(folder.name, sampling, rows))
        data.append({"run": str(folder), "sampling": sampling, "goal": GOAL, "rows": [asdict(r) for r in rows]})
    text = "\n".join(tables)
    print(text, end="")
    if args.out_md:
        Path(args.out_md).write_text(text, encoding="utf-8")
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(_jsonable(data), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
