"""The goals' verdicts, and issue 32's run goals checked on two CLI run folders (``benchmarks/pass_goals.py``).

A run folder is what ``specfamily run`` writes: ``summary.csv`` (one row per dataset, sampling and drafter, with
``speedup`` measured against plain decoding in the same run and ``predicted_speedup`` from the report's model) and
``run.json``. The goals read there: every drafter's predicted speedup within 10% of its measured one, greedy and
sampled; every drafter >= 0.98x plain decoding; at t0.7 / top-p 0.9 the best drafter >= 1.25x.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

WITHIN = 0.10  # |predicted / measured - 1|
FLOOR = 0.98  # every drafter's speedup
BEST_SAMPLED = 1.25  # the best drafter's speedup at t0.7 / top-p 0.9
CHAT_LABEL = "t0.7-p0.9"  # summary.csv's sampling column for temperature 0.7, top-p 0.9
COLUMNS = ("dataset", "sampling", "drafter", "status", "speedup", "predicted_speedup")  # what the goals read


@dataclass
class Goal:
    """One goal's line: ``value`` against ``limit`` (at most, or ``at_least``); ``arms``: the timed arms it
    compares (numerator first), split into parts when it is missed."""

    name: str
    value: float
    limit: float
    arms: tuple[str, ...] = ()
    at_least: bool = False
    note: str = ""
    measured: bool = True  # False: the run could not measure what the goal needs (the note says why)

    @property
    def met(self) -> bool:
        if math.isnan(self.value) or not self.measured:
            return False
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    def as_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "limit": self.limit, "at_least": self.at_least,
                "met": self.met, "measured": self.measured, "arms": list(self.arms), "note": self.note}


def goals_table(goals: list[Goal]) -> str:
    lines = ["| goal | measured | goal | verdict |", "|---|---:|---:|---|"]
    for g in goals:
        verdict = "not measured" if not g.measured else "met" if g.met else "missed"
        note = f" ({g.note})" if g.note else ""
        lines.append(f"| {g.name}{note} | {g.value:.3f} | {'>=' if g.at_least else '<='} {g.limit:.2f} | {verdict} |")
    return "\n".join(lines)


@dataclass
class RunRow:
    """One drafter's row of a run's summary.csv."""

    dataset: str
    sampling: str
    drafter: str
    speedup: float
    predicted: float
    tau: float = math.nan


def read_summary(folder: str | Path) -> list[RunRow]:
    """The drafters' rows (plain decoding and failed arms left out) of ``folder``'s summary.csv."""
    path = Path(folder) / "summary.csv"
    if not path.is_file():
        raise SystemExit(f"{folder}: no summary.csv (is it a run folder? `specfamily run` writes one)")
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    missing = [column for column in COLUMNS if column not in (reader.fieldnames or ())]
    if missing:
        raise SystemExit(f"{path}: no column(s) {missing}")
    return [RunRow(r["dataset"], r["sampling"], r["drafter"], _number(r["speedup"]), _number(r["predicted_speedup"]),
                   _number(r.get("tau", "nan"))) for r in rows if r["drafter"] != "plain" and r["status"] == "ok"]


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def run_goals(greedy: str | Path | None, sampled: str | Path | None) -> tuple[list[Goal], str]:
    """Goals 4-5 of the issue on a greedy and a sampled run folder (either may be None): per run and dataset, the
    worst drafter's prediction error, the slowest drafter, and (sampled) the best drafter; and the per-drafter table."""
    goals, lines = [], ["| run | dataset | sampling | drafter | tau | predicted | measured | predicted / measured |",
                        "|---|---|---|---|---:|---:|---:|---:|"]
    for label, folder in (("greedy run", greedy), ("sampled run", sampled)):
        if folder is None:
            continue
        rows = read_summary(folder)
        if not rows:
            raise SystemExit(f"{folder}: summary.csv holds no finished drafter rows")
        for dataset in sorted({r.dataset for r in rows}):
            these = [r for r in rows if r.dataset == dataset]
            goals += dataset_goals(label, dataset, these)
            lines += [f"| {label} | {dataset} | {r.sampling} | {r.drafter} | {r.tau:.2f} | {r.predicted:.3f} "
                      f"| {r.speedup:.3f} | {r.predicted / r.speedup:.3f} |" for r in these]
    return goals, "\n".join(lines)


def dataset_goals(label: str, dataset: str, rows: list[RunRow]) -> list[Goal]:
    """One run's goals on one dataset's drafter rows."""
    worst = max(rows, key=lambda r: abs(r.predicted / r.speedup - 1))
    slowest = min(rows, key=lambda r: r.speedup)
    where = f"{label} {dataset} ({rows[0].sampling})"
    goals = [Goal(f"{where}: every drafter's abs(predicted / measured - 1)", abs(worst.predicted / worst.speedup - 1),
                  WITHIN, note=f"worst {worst.drafter}: {worst.predicted:.2f} vs {worst.speedup:.2f}"),
             Goal(f"{where}: every drafter's speedup", slowest.speedup, FLOOR, at_least=True,
                  note=f"slowest {slowest.drafter}")]
    if label == "sampled run":
        best = max(rows, key=lambda r: r.speedup)
        note = best.drafter if best.sampling == CHAT_LABEL else f"{best.drafter}; run at {best.sampling}, not t0.7/p0.9"
        goals.append(Goal(f"{where}: the best drafter's speedup", best.speedup, BEST_SAMPLED, at_least=True,
                          note=note))
    return goals
