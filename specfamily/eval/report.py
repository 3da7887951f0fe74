"""Reports from saved results: ``summary.csv``, ``report.md`` and plots, for one run or a whole sweep.

When the records carry a category (or prompts have several turns), ``report.md`` also breaks tau
and speedup down by category (and by turn) and ``breakdown.csv`` holds those rows
(:mod:`specfamily.eval.breakdown`). Every run's noise checks (:mod:`specfamily.eval.noise`) are
listed, and a run whose timings were unstable is flagged at the top.

``specfamily-report DIR`` rebuilds them from the ``run.json`` and ``results.jsonl`` files under
DIR (DIR itself for one run; every run folder below it for a sweep, in one combined report).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from specfamily.core.costs import verify_cost_at
from specfamily.eval.breakdown import BREAKDOWN, GroupRow, breakdown_csv, breakdown_markdown, breakdown_rows
from specfamily.eval.concurrency import CLOCKS, concurrency_markdown, concurrency_series, plot_speedup_by_batch
from specfamily.eval.concurrency import PLOT as LOAD_PLOT
from specfamily.eval.goodput import GoodputRow, goodput_markdown, goodput_rows
from specfamily.eval.latency import LatencyRow, latency_markdown, latency_rows
from specfamily.eval.noise import describe, noise_checks
from specfamily.eval.plots import plot_all
from specfamily.eval.results import (
    RUN_INFO,
    FailureRecord,
    NoiseCheck,
    PromptRecord,
    RunInfo,
    read_repeats,
    read_run,
    write_atomic,
)
from specfamily.eval.summary import SummaryRow, run_name, summarize_run

SUMMARY = "summary.csv"
REPORT = "report.md"
COLUMNS = ("drafter", "gamma", "status", "prompts", "tau", "tau 95% CI", "drafted", "alpha", "speedup",
           "speedup 95% CI", "predicted_speedup", "identical", "c", "verify_cost", "lossy")
RUN_COLUMNS = ("run", "dataset", "sampling")


@dataclass
class Report:
    """What ``write_report`` wrote: the Markdown table and the files."""

    table: str
    rows: list[SummaryRow]
    files: list[Path]
    groups: list[GroupRow] = field(default_factory=list)  # the breakdown by category / turn (may be empty)
    noise: dict[str, list[NoiseCheck]] = field(default_factory=dict)  # run name -> its noise checks
    latency: list[LatencyRow] = field(default_factory=list)  # time to first token, per-token latency, peak memory
    goodput: list[GoodputRow] = field(default_factory=list)  # each arm's goodput and request latency under load


def find_runs(folder: Path) -> list[Path]:
    """``folder`` if it is a run folder, else every run folder below it (sorted)."""
    if (folder / RUN_INFO).is_file():
        return [folder]
    runs = sorted({path.parent for path in folder.rglob(RUN_INFO)}, key=lambda p: [_natural(x) for x in p.parts])
    if not runs:
        raise FileNotFoundError(f"no {RUN_INFO} under {folder}: not a specfamily run or sweep folder")
    return runs


def _natural(part: str) -> tuple[int, str]:
    return (int(part), "") if part.isdigit() else (sys.maxsize, part)


@dataclass
class Collected:
    """Everything the report is made of, over every run under a folder."""

    rows: list[SummaryRow] = field(default_factory=list)
    infos: list[RunInfo] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    groups: list[GroupRow] = field(default_factory=list)
    noise: dict[str, list[NoiseCheck]] = field(default_factory=dict)  # run name -> its noise checks
    latency: list[LatencyRow] = field(default_factory=list)
    goodput: list[GoodputRow] = field(default_factory=list)


def collect(folder: Path) -> Collected:
    """Summary rows, run infos, failures and the breakdown rows of every run under ``folder``."""
    found = Collected()
    for run in find_runs(folder):
        info = RunInfo.load(run)
        records = read_run(run)
        name = run_name(info, run.relative_to(folder).as_posix() if run != folder else ".")
        found.rows += summarize_run(records, info, name)
        found.infos.append(info)
        found.failures += [r for r in records if isinstance(r, FailureRecord)]
        found.groups += breakdown_rows(records, info, name)
        found.noise[name] = noise_checks(records, read_repeats(run), info)
        found.latency += latency_rows(records, name)
        found.goodput += goodput_rows(records, name)
    return found


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.2f}"
    return str(value)


def _display(row: SummaryRow, column: str) -> str:
    if column == "tau 95% CI":
        return str(row.tau_ci)
    if column == "speedup 95% CI":
        return str(row.speedup_ci)
    if column == "identical":
        return "-" if row.identical is None else f"{row.identical}/{row.compared}"
    if column == "drafted":
        return "-" if not math.isfinite(row.drafted) else f"{row.drafted:.0%}"
    return _cell(getattr(row, column))


def markdown_table(rows: list[SummaryRow]) -> str:
    """The comparison table; run, dataset and sampling columns appear when they vary."""
    extra = [col for col in RUN_COLUMNS if len({getattr(r, col) for r in rows}) > 1]
    columns = [*extra, *COLUMNS]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(_display(row, col) for col in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def summary_csv(rows: list[SummaryRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[f.name for f in fields(SummaryRow)], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        record = asdict(row)
        for name in ("per_position", "conditional"):
            record[name] = json.dumps([None if not math.isfinite(x) else round(x, 4) for x in getattr(row, name)])
        writer.writerow(record)
    return buffer.getvalue()


def _verify_cost_fn(infos: list[RunInfo]) -> Callable[[int], float]:
    """t(g + 1) / t(1) for the plots: the median over the runs' measured curves."""
    curves = [{int(g): v for g, v in info.verify_cost.items()} for info in infos if info.verify_cost]
    return lambda g: statistics.median(verify_cost_at(curve, g) for curve in curves) if curves else 1.0


def _header(infos: list[RunInfo]) -> list[str]:
    first = infos[0]
    model = first.config.get("model", {})
    git = first.git or {}
    versions = ", ".join(f"{k} {first.versions.get(k)}" for k in ("specfamily", "torch", "transformers"))
    curve = ", ".join(f"{g}: {v:.2f}" for g, v in list(first.verify_cost.items())[:10]) or "not measured (taken as 1)"
    datasets, samplings = ", ".join(sorted({i.dataset for i in infos})), ", ".join(sorted({i.sampling for i in infos}))
    lines = [
        f"- target: `{model.get('target')}`; runs: {len(infos)}; datasets: {datasets}; sampling: {samplings}",
        f"- prompts per run: {first.prompts}, up to {first.max_new_tokens} new tokens, seed {first.seed}",
        f"- device {first.device}, {first.threads} thread(s) per rank, {first.world_size} rank(s), matmul "
        f"{first.matmul}{_matmul_timings(first.matmul_seconds)}; {versions}",
        f"- {_machine(first)}",
        f"- git: {git.get('commit', 'unknown')}{' (with local changes)' if git.get('dirty') else ''}",
        f"- verify cost t(g+1)/t(1) by draft tokens g: {curve}",
    ]
    return lines


def _matmul_timings(seconds: dict[str, float]) -> str:
    """`` (auto timed: <kind> <t> ms, ...)``, one median per kind timed, or nothing when the kind was not timed."""
    if not seconds:
        return ""
    return " (auto timed: " + ", ".join(f"{kind} {s * 1e3:.1f} ms" for kind, s in seconds.items()) + ")"


def _machine(info: RunInfo) -> str:
    hw, weights = info.hardware, info.weights or {}
    gpu = f"GPU {hw['gpu']} (CUDA {hw.get('cuda')})" if hw.get("gpu") else "no GPU"
    load = hw.get("load_average_1m")
    return (f"machine: {hw.get('cpu') or 'unknown CPU'}, {hw.get('usable_cpus', '?')} usable core(s), {gpu}"
            + (f", load average {load:.2f} at the start" if load is not None else "")
            + f"; target weights sha256 {str(weights.get('sha256', 'unknown'))[:12]}"
            + f"; prompts sha256 {(info.dataset_fingerprint or 'unknown')[:12]}")


def noise_markdown(noise: dict[str, list[NoiseCheck]]) -> str:
    """The "Noise" section: every run's checks, one line each."""
    lines = ["## Noise\n"]
    for run, checks in noise.items():
        prefix = f"[{run}] " if len(noise) > 1 else ""
        lines += [f"- {prefix}{describe(check)}" for check in checks]
    return "\n".join(lines) + "\n"


def unstable_warning(noise: dict[str, list[NoiseCheck]]) -> str:
    """A warning for the top of the report when any run's timings were unstable ("" when none was)."""
    flagged = [(run, c) for run, checks in noise.items() for c in checks if c.unstable]
    if not flagged:
        return ""
    lines = [f"> **Unstable timings**{f' [{run}]' if len(noise) > 1 else ''}: {describe(c, verdict=False)}"
             for run, c in flagged]
    lines.append("> Speedups and c from this machine are not trustworthy; rerun on a quiet machine.")
    return "\n".join(lines) + "\n"


NOTES = """\
tau = new tokens / target passes (prefill included; plain decoding = 1). alpha = mean per-prompt
acceptance rate. speedup = tokens per second relative to plain decoding over the same prompts in
the same run. 95% CI: bootstrap percentile intervals over prompts (a question's turns together;
speedup paired by prompt, as a ratio of sums); "-" with under 3 prompts. identical = prompts whose
tokens equal plain decoding's (greedy runs only; bf16 on a GPU can flip near-ties). verify_cost = what
a drafted pass cost in this run relative to plain decoding's pass (mean verify seconds, prefill left
out: the real pass, with its tree, cache rewrite, cache lengths and sampling). predicted = the
acceptance model on the run's own costs: tokens per pass share * (1 - alpha^(gamma + 1)) / (1 - alpha)
+ 1 - share (share: passes that drafted; gamma: the mean drafted depth when the policy varies it)
over the drafter's measured prefills and mean pass time (for tree drafters the chain formula is an
approximation). Results from before runs timed their passes: `sf.theory.expected_speedup(alpha,
gamma, c * V, V)` with V the cost curve t(n + 1) / t(1) at the draft tokens n fed per pass.
lossy = results of a lossy mode (e.g. Medusa typical acceptance).
"""


GROUP_NOTES = """\
Each group's tau and speedup are over that group's prompts only (speedup against plain decoding on
the same prompts); a multi-turn prompt counts once per turn, and turn t is asked after each arm's
own earlier answers.
"""


def policy_notes(rows: list[SummaryRow]) -> str:
    """What each drafter's draft-length policy said at the end of its run, for those that drafted in fewer than
    every pass (a cost-aware policy that drafts nothing says why, next to the tau it measured)."""
    lines = [f"- `{row.drafter}`" + (f" [{row.run}]" if row.run != "." else "") + f" (tau {row.tau:.2f}): "
             f"{row.policy_note}" for row in rows
             if row.policy_note and math.isfinite(row.drafted) and row.drafted < 1.0]
    return "## Draft-length policy\n\n" + "\n".join(lines) + "\n" if lines else ""


def render(
    rows: list[SummaryRow], infos: list[RunInfo], failures: list[FailureRecord], plots: list[Path],
    groups: list[GroupRow] | None = None, noise: dict[str, list[NoiseCheck]] | None = None,
    latency: list[LatencyRow] | None = None, goodput: list[GoodputRow] | None = None,
) -> str:
    """The text of ``report.md``."""
    parts = ["# specfamily comparison\n", "\n".join(_header(infos)) + "\n"]
    if noise and unstable_warning(noise):
        parts.append(unstable_warning(noise))
    parts += [markdown_table(rows), NOTES]
    notes = policy_notes(rows)
    if notes:
        parts.append(notes)
    if latency and latency_markdown(latency):
        parts.append(latency_markdown(latency))
    load = [s for clock in CLOCKS for s in concurrency_series(goodput or [], clock)]
    for section in (goodput_markdown(goodput or []), concurrency_markdown(load)):
        if section:
            parts.append(section)
    if groups:
        parts += [breakdown_markdown(groups), GROUP_NOTES]
    if noise:
        parts.append(noise_markdown(noise))
    failed = [r for r in rows if r.status == "failed"]
    if failed:
        parts.append("## Failures\n")
        parts += [f"- `{r.drafter}`" + (f" [{r.run}]" if r.run != "." else "") + f": {r.error}" for r in failed]
        parts.append("")
    parts += [f"![{path.stem}]({path.name})\n" for path in plots]
    return "\n".join(parts)


def write_report(folder: Path | str, plots: bool = True) -> Report:
    """Rebuild ``summary.csv``, ``report.md`` and the plots in ``folder`` from its saved results."""
    folder = Path(folder)
    found = collect(folder)
    written = plot_all(found.rows, _verify_cost_fn(found.infos), folder) if plots else []
    load = concurrency_series(found.goodput, "cpu") or concurrency_series(found.goodput, "wall")  # CPU: steadier
    if plots and load:
        written.append(plot_speedup_by_batch(load, folder / LOAD_PLOT))
    write_atomic(folder / SUMMARY, summary_csv(found.rows))
    write_atomic(folder / REPORT, render(found.rows, found.infos, found.failures, written, found.groups, found.noise,
                                         found.latency, found.goodput))
    files = [folder / SUMMARY, folder / REPORT, *written]
    if found.groups:
        write_atomic(folder / BREAKDOWN, breakdown_csv(found.groups))
        files.append(folder / BREAKDOWN)
    return Report(markdown_table(found.rows), found.rows, files, found.groups, found.noise, found.latency,
                  found.goodput)


def write_html(folder: Path | str, report: Report) -> Path:
    """Write the self-contained ``report.html`` (:mod:`specfamily.eval.html`) beside the ``report.md`` that
    ``report`` is: the report, and every prompt's answers from the records of the runs under ``folder``."""
    from specfamily.eval.html import HTML, render_html

    folder = Path(folder)
    records = [(None if run == folder else run.relative_to(folder).as_posix(), record)
               for run in find_runs(folder) for record in read_run(run) if isinstance(record, PromptRecord)]
    path = folder / HTML
    write_atomic(path, render_html((folder / REPORT).read_text(encoding="utf-8"), folder, report.rows, records))
    return path


def main(argv: list[str] | None = None) -> int:
    """``specfamily-report DIR [--html]``: rebuild the report of a run or a sweep and print its table."""
    from specfamily.eval.html import HTML

    parser = argparse.ArgumentParser(prog="specfamily-report", description=main.__doc__)
    parser.add_argument("folder", type=Path, help="a run folder (with run.json) or a sweep folder above run folders")
    parser.add_argument("--no-plots", action="store_true", help="skip the plots")
    parser.add_argument("--html", action="store_true", help=f"also write {HTML}: one self-contained page to look at")
    args = parser.parse_args(argv)
    try:
        report = write_report(args.folder, plots=not args.no_plots)
        if args.html:
            report.files.append(write_html(args.folder, report))
    except FileNotFoundError as err:
        print(f"specfamily-report: {err}", file=sys.stderr)
        return 2
    print(report.table, end="")
    print("\n".join(f"wrote {path}" for path in report.files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
