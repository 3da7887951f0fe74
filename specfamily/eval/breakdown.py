"""Results broken down by category (and by turn): tau and speedup of every drafter on each group of prompts.

A run whose records carry a category gets one row per (category, drafter) plus an ``overall`` row per drafter, and
the same per turn for multi-turn prompts. Speedup is against plain decoding on the group's prompts in the same run
(:func:`specfamily.eval.summary.speedup`). The report pivots the rows into a table with a tau and a speedup column per
drafter (with a bootstrap 95% interval when the group has at least 3 prompts).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from specfamily.eval.config import PLAIN
from specfamily.eval.results import PromptRecord, Record, RunInfo
from specfamily.eval.stats import NO_INTERVAL, Interval
from specfamily.eval.summary import speedup, speedup_ci, tau_interval

BREAKDOWN = "breakdown.csv"
OVERALL = "overall"  # the group of every prompt
NO_CATEGORY = "(none)"  # records without a category in a run where others have one
NAN = float("nan")


@dataclass
class GroupRow:
    """One drafter (or plain decoding) on one group of a run's prompts."""

    run: str
    dataset: str
    sampling: str
    by: str  # category | turn
    group: str  # the category, the turn number, or "overall"
    drafter: str
    prompts: int  # records (one per prompt turn) of this drafter in the group
    new_tokens: int
    tau: float
    speedup: float
    tau_low: float = NAN  # bootstrap 95% interval over the group's prompts
    tau_high: float = NAN
    speedup_low: float = NAN
    speedup_high: float = NAN

    @property
    def speedup_ci(self) -> Interval:
        return Interval(self.speedup_low, self.speedup_high)


def _groups(
    records: list[PromptRecord], info: RunInfo, run: str, by: str, key: Callable[[PromptRecord], str]
) -> list[GroupRow]:
    labels = list(dict.fromkeys([*info.drafters, *(r.drafter for r in records)]))
    groups = list(dict.fromkeys(key(r) for r in records))
    rows = []
    for group in [*groups, OVERALL]:
        members = [r for r in records if group == OVERALL or key(r) == group]
        plain = [r for r in members if r.drafter == PLAIN]
        for label in labels:
            mine = [r for r in members if r.drafter == label]
            tau_ci, passes = tau_interval(mine), sum(r.metrics["target_passes"] for r in mine)
            spread = NO_INTERVAL if label == PLAIN else speedup_ci(mine, plain)
            rows.append(GroupRow(
                run=run, dataset=info.dataset, sampling=info.sampling, by=by, group=group, drafter=label,
                prompts=len(mine), new_tokens=(new := sum(r.metrics["new_tokens"] for r in mine)),
                tau=new / passes if passes else NAN,
                speedup=speedup(mine, plain) if mine else NAN, tau_low=tau_ci.low, tau_high=tau_ci.high,
                speedup_low=spread.low, speedup_high=spread.high,
            ))
    return rows


def breakdown_rows(records: list[Record], info: RunInfo, run: str = ".") -> list[GroupRow]:
    """Rows by category when any record has one, and by turn when any prompt has a second turn; else none."""
    prompts = [r for r in records if isinstance(r, PromptRecord)]
    rows = []
    if any(r.category is not None for r in prompts):
        rows += _groups(prompts, info, run, "category", lambda r: NO_CATEGORY if r.category is None else r.category)
    if any(r.turn > 1 for r in prompts):
        rows += _groups(sorted(prompts, key=lambda r: r.turn), info, run, "turn", lambda r: str(r.turn))
    return rows


def _number(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "-"


def _pivot(rows: list[GroupRow]) -> str:
    """One Markdown table: a row per group, the prompts, then each drafter's tau and speedup."""
    drafters = [d for d in dict.fromkeys(r.drafter for r in rows)
                if d != PLAIN and any(r.prompts for r in rows if r.drafter == d)]
    cells = {(r.group, r.drafter): r for r in rows}
    header = ["" if not rows else rows[0].by, "prompts"]
    header += [f"{d} {column}" for d in drafters for column in ("tau", "speedup")]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    for group in dict.fromkeys(r.group for r in rows):
        counted = [cells[group, d].prompts for d in (PLAIN, *drafters) if (group, d) in cells]
        values = [group, str(cells[group, PLAIN].prompts if (group, PLAIN) in cells else max(counted, default=0))]
        for d in drafters:
            row = cells.get((group, d))
            interval = "" if row is None or not row.speedup_ci.known else f" ({row.speedup_ci})"
            values += ["-", "-"] if row is None else [_number(row.tau), _number(row.speedup) + interval]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def breakdown_markdown(rows: list[GroupRow]) -> str:
    """The report's sections: "By category" and "By turn", one table per run (headed by the run when several)."""
    runs = list(dict.fromkeys(r.run for r in rows))
    parts = []
    for by in dict.fromkeys(r.by for r in rows):
        parts.append(f"## By {by}\n")
        for run in runs:
            mine = [r for r in rows if r.by == by and r.run == run]
            if mine and len(runs) > 1:
                parts.append(f"run `{run}`:\n")
            if mine:
                parts.append(_pivot(mine))
    return "\n".join(parts)


def breakdown_csv(rows: list[GroupRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[f.name for f in fields(GroupRow)], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(asdict(row))
    return buffer.getvalue()
