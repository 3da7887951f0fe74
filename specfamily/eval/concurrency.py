"""The concurrency sweep's report: each drafter's speedup over plain batched decoding against the batch size.

Over the runs of a sweep (``specfamily --multirun batch_size=1,2,4,8,16,32 ...`` or ``experiment=batch_sweep``),
each run's goodput rows (:mod:`specfamily.eval.goodput`) are put side by side by batch size: the table gives plain
decoding's goodput and every drafter's speedup (its goodput / plain decoding's in the same run) at each batch size,
and the **crossover**: the smallest batch size at which the drafter is slower than plain decoding. Runs that differ
in something else than ``batch_size`` (their run labels with ``batch_size=<B>`` taken out) are separate series.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from specfamily.eval.config import PLAIN
from specfamily.eval.goodput import GoodputRow

PLOT = "speedup_by_batch.png"
NAN = float("nan")
_BATCH_OVERRIDE = re.compile(r"(?:^|,)\+{0,2}batch_size=[^,]*")


def series_name(run: str) -> str:
    """A run's series: its label without its ``batch_size=`` override ("" when that was all it set)."""
    return _BATCH_OVERRIDE.sub("", run).strip(",")


CLOCKS = ("wall", "cpu")


@dataclass
class Series:
    """One series of the sweep on one clock: batch sizes, plain goodput and each drafter's speedup by batch size."""

    name: str
    clock: str = "wall"  # wall: seconds of wall time; cpu: CPU seconds of the process (one thread: steadier)
    batches: list[int] = field(default_factory=list)
    plain: dict[int, float] = field(default_factory=dict)  # B -> plain decoding's goodput (tokens/s)
    speedup: dict[str, dict[int, float]] = field(default_factory=dict)  # drafter -> B -> speedup

    def crossover(self, drafter: str) -> int | None:
        """The smallest batch size at which ``drafter`` is slower than plain decoding (None: never, in the sweep)."""
        by_batch = self.speedup[drafter]
        return next((b for b in self.batches if b in by_batch and by_batch[b] < 1.0), None)


def _goodput(row: GoodputRow, clock: str) -> float:
    return row.goodput if clock == "wall" else row.cpu_goodput


def concurrency_series(rows: list[GoodputRow], clock: str = "wall") -> list[Series]:
    """The sweep's series on ``clock`` (wall or cpu), each with at least two batch sizes (else there is no sweep to
    show); on the cpu clock only series whose every run recorded CPU seconds (batched runs)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    found: dict[str, Series] = {}
    plain_of = {row.run: _goodput(row, clock) for row in rows if row.drafter == PLAIN}
    for row in rows:
        series = found.setdefault(series_name(row.run), Series(series_name(row.run), clock))
        value, base = _goodput(row, clock), plain_of.get(row.run, NAN)
        if row.drafter == PLAIN:
            if row.batch_size in series.plain:
                raise ValueError(f"two runs of series {series.name or '(default)'!r} at batch_size={row.batch_size}; "
                                 "give them different settings (run labels) to report them apart")
            series.plain[row.batch_size] = value
        elif math.isfinite(value) and math.isfinite(base) and base > 0:
            series.speedup.setdefault(row.drafter, {})[row.batch_size] = value / base
    for series in found.values():
        series.batches = sorted(series.plain)
    return [s for s in found.values() if len(s.batches) > 1 and all(math.isfinite(v) for v in s.plain.values())]


def _cells(series: Series) -> list[list[str]]:
    header = ["drafter", *(f"B={b}" for b in series.batches), "crossover"]
    plain = ["plain (tok/s)", *(f"{series.plain[b]:.1f}" for b in series.batches), ""]
    rows = [header, plain]
    for drafter, by_batch in series.speedup.items():
        cross = series.crossover(drafter)
        rows.append([drafter, *(f"{by_batch[b]:.2f}x" if b in by_batch else "-" for b in series.batches),
                     str(cross) if cross is not None else f"none up to {series.batches[-1]}"])
    return rows


def concurrency_markdown(all_series: list[Series]) -> str:
    """The "Speedup by load" section ("" without a series of two batch sizes or more): a table per series and
    clock."""
    if not all_series:
        return ""
    parts = ["## Speedup by load\n"]
    for series in all_series:
        prefix = f"Series `{series.name}`, by" if series.name else "By"
        parts.append(f"{prefix} {CLOCK_WORDS[series.clock]}:\n")
        header, *body = _cells(series)
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        parts.append("\n".join(lines + ["| " + " | ".join(row) + " |" for row in body]) + "\n")
    parts.append(CONCURRENCY_NOTES)
    return "\n".join(parts)


CLOCK_WORDS = {"wall": "wall time", "cpu": "CPU time (the process's; with one thread, steadier on a shared machine)"}
CONCURRENCY_NOTES = """\
Each cell: the drafter's goodput (new tokens per second of the run's decoding, on the clock named) over plain
batched decoding's at the same batch size B (B=1: one request after another); the plain row is plain decoding's
goodput in tokens/s. crossover = the smallest B at which the drafter is slower than plain decoding.
"""


def plot_speedup_by_batch(all_series: list[Series], path: Path) -> Path:
    """Speedup against batch size (log 2 axis), one line per drafter (and series), each crossover marked x."""
    from specfamily.eval.plots import _figure, _save, line_style

    figure = _figure(7.0, 4.5)
    ax = figure.add_subplot()
    lines = 0
    for series in all_series:
        for drafter, by_batch in series.speedup.items():
            xs = [b for b in series.batches if b in by_batch]
            label = drafter if len(all_series) == 1 else f"{drafter} [{series.name or 'default'}]"
            (line,) = ax.plot(xs, [by_batch[b] for b in xs], marker="o", label=label, linestyle=line_style(lines))
            lines += 1
            cross = series.crossover(drafter)
            if cross is not None:
                ax.plot([cross], [by_batch[cross]], marker="x", markersize=13, markeredgewidth=2,
                        color=line.get_color())
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    batches = sorted({b for s in all_series for b in s.batches})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size B (requests decoded at once)")
    ax.set_ylabel("goodput / plain batched decoding's")
    ax.set_title(f"speedup by load, {all_series[0].clock} clock (x: crossover, the first B below plain)")
    ax.legend(fontsize=8)
    return _save(figure, path)
