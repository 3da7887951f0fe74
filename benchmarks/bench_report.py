"""Benchmark reports: the Markdown table, mismatch lines, the machine and versions, JSON and text files."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pairs import PairResult, Skipped


def _cell(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f}"


def _interval(values: list[float]) -> str:
    """median [min-max] over the repeats."""
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def markdown_table(results: list[PairResult], skipped: Sequence[Skipped] = ()) -> str:
    """The report table: method, ours and theirs ms/token, ratio (median [min-max]), tau, identical; and, where a
    row timed our plain decoding beside it, its speedup over that (median [min-max], paired per repeat)."""
    paired = any(r.plain_ms for r in results)
    head = "| method | vs | ours ms/token | theirs ms/token | ratio (theirs/ours) | tau | identical? |"
    rule = "| --- | --- | ---: | ---: | ---: | ---: | --- |"
    lines = [head + " over our plain |" if paired else head, rule + " ---: |" if paired else rule]
    for r in results:
        same = "yes" if r.identical else f"NO ({len(r.mismatches)} prompt(s))"
        cells = [r.name, r.theirs_label, _cell(r.ours_ms), _cell(r.theirs_ms), _interval(r.ratios), f"{r.tau:.2f}",
                 same]
        if paired:
            cells.append(_interval(r.speedups) if r.plain_ms else "-")
        lines.append("| " + " | ".join(cells) + " |")
    for s in skipped:
        lines.append(f"| {s.name} | skipped | - | - | - | - | {s.reason} |" + (" - |" if paired else ""))
    return "\n".join(lines)


def describe_mismatches(results: list[PairResult]) -> list[str]:
    """One line per mismatch, for the console."""
    lines = []
    for r in results:
        for m in r.mismatches:
            lines.append(
                f"MISMATCH {r.name} vs {m.against}: prompt {m.prompt}, position {m.position}: "
                f"ours {m.ours} != {m.other}"
            )
    return lines


def environment(threads: int, clock: str) -> dict:
    """Machine and versions, for the report."""
    import transformers

    import specfamily

    return {
        "machine": platform.machine(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "specfamily": specfamily.__version__,
        "threads": threads,
        "clock": clock,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as JSON atomically (nan becomes null)."""
    return write_text(path, json.dumps(_finite(data), indent=2, default=str, allow_nan=False) + "\n")


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` atomically (a temporary file renamed over ``path``)."""
    from specfamily.io.files import write_text_atomically

    return write_text_atomically(path, text)


def _finite(value):
    """nan and inf become None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
