"""Report plots (matplotlib, Agg canvas; no global backend or pyplot state is touched): ``speedup_vs_gamma.png``
(measured speedup per drafter with its 95% interval, and the theory curve from the measured alpha, c and verify
cost), ``per_position_acceptance.png`` (cumulative and where tried) and ``tau_by_dataset.png``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path

from specfamily.core import theory
from specfamily.eval.config import PLAIN
from specfamily.eval.summary import SummaryRow
from specfamily.io.files import write_atomically

PLOTS = ("speedup_vs_gamma.png", "per_position_acceptance.png", "tau_by_dataset.png")


LINE_STYLES = ("-", "--", ":", "-.")


def line_style(index: int) -> str:
    """The style of a plot's ``index``-th line: solid for the colour cycle's first ten, then dashed, dotted, ...,
    so a plot of more lines than colours (every registered drafter) still tells each apart."""
    return LINE_STYLES[(index // 10) % len(LINE_STYLES)]


def _figure(width: float = 6.4, height: float = 4.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    return write_atomically(path, figure.savefig)


def _finite(x: float) -> bool:
    return x is not None and math.isfinite(x)


def _interval_bars(ax, rows: list[SummaryRow], color: str) -> None:
    """Each row's bootstrap 95% speedup interval as an error bar at its gamma."""
    if rows:
        below = [max(r.speedup - r.speedup_low, 0.0) for r in rows]
        above = [max(r.speedup_high - r.speedup, 0.0) for r in rows]
        ax.errorbar([r.gamma for r in rows], [r.speedup for r in rows], yerr=[below, above], fmt="none", ecolor=color,
                    capsize=3)


def plot_speedup_vs_gamma(rows: list[SummaryRow], verify_cost: Callable[[int], float], path: Path) -> Path:
    figure = _figure()
    ax = figure.add_subplot()
    measured = [r for r in rows if r.drafter != PLAIN and r.gamma and _finite(r.speedup)]
    top = max([8, *(r.gamma for r in measured)])
    gammas = list(range(1, top + 1))
    for i, name in enumerate(dict.fromkeys(r.drafter for r in rows if r.drafter != PLAIN and r.prompts)):
        color = f"C{i % 10}"
        mine = sorted((r for r in measured if r.drafter == name), key=lambda r: r.gamma)
        if mine:
            ax.plot([r.gamma for r in mine], [r.speedup for r in mine], "o-", color=color, label=f"{name} (measured)")
            _interval_bars(ax, [r for r in mine if r.speedup_ci.known], color)
        fit = [r for r in rows if r.drafter == name and _finite(r.alpha) and _finite(r.c)]
        if fit:
            alpha = min(max(statistics.fmean(r.alpha for r in fit), 0.0), 1.0)
            c = statistics.fmean(r.c for r in fit)
            theory_speedup = [theory.expected_speedup(alpha, g, c * verify_cost(g), verify_cost(g)) for g in gammas]
            ax.plot(gammas, theory_speedup, "--", color=color, alpha=0.7,
                    label=f"{name} theory (alpha={alpha:.2f}, c={c:.2f})")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("gamma (draft length / tree depth)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("Speedup against gamma")
    ax.legend(fontsize="small")
    return _save(figure, path)


def plot_per_position(rows: list[SummaryRow], path: Path) -> Path:
    figure = _figure()
    ax = figure.add_subplot()
    for row in rows:
        if row.drafter == PLAIN or not row.per_position:
            continue
        label = row.drafter + (f" (gamma={row.gamma})" if row.gamma else "")
        label += "" if row.run == "." else f" [{row.run}]"
        line, = ax.plot(range(1, len(row.per_position) + 1), row.per_position, "o-", label=label)
        if row.conditional:
            ax.plot(range(1, len(row.conditional) + 1), row.conditional, "x--", color=line.get_color())
    ax.set_xlabel("draft position (depth)")
    ax.set_ylabel("acceptance (o: cumulative P(accepted > depth - 1); x: where the depth was tried)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance")
    if ax.lines:
        ax.legend(fontsize="small")
    return _save(figure, path)


def plot_tau(rows: list[SummaryRow], path: Path) -> Path:
    figure = _figure()
    ax = figure.add_subplot()
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    drafters = list(dict.fromkeys(r.drafter for r in rows if r.prompts))
    width = 0.8 / max(len(drafters), 1)
    for i, name in enumerate(drafters):
        taus = []
        for dataset in datasets:
            mine = [r.tau for r in rows if r.drafter == name and r.dataset == dataset and _finite(r.tau)]
            taus.append(statistics.fmean(mine) if mine else 0.0)
        ax.bar([d + i * width for d in range(len(datasets))], taus, width, label=name, color=f"C{i % 10}")
    ax.set_xticks([d + 0.4 - width / 2 for d in range(len(datasets))], datasets)
    ax.set_ylabel("tau (new tokens per target pass)")
    ax.set_title("tau per drafter and dataset")
    ax.legend(fontsize="small")
    return _save(figure, path)


def plot_all(rows: list[SummaryRow], verify_cost: Callable[[int], float], folder: Path) -> list[Path]:
    """Write the three plots into ``folder``."""
    return [
        plot_speedup_vs_gamma(rows, verify_cost, folder / PLOTS[0]),
        plot_per_position(rows, folder / PLOTS[1]),
        plot_tau(rows, folder / PLOTS[2]),
    ]
