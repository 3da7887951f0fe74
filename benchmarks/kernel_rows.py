"""The stream kernel's products at a few rows: t(rows) / t(1) over every linear weight of SmolLM2 (issue 32).

A drafted pass feeds 3-8 rows, a plain one 1; the products of the drafted pass should cost little more than the
plain pass's. This script times one pass of products (every layer's q/k/v/o and gate/up/down, the tied head once:
``bandwidth.load_weights``, zoo:smollm2's weights when fetched, else random float32 of its shapes) at each row count
of ``--rows``, for the kernel of this checkout and, with ``--baseline REF``, for the kernel's sources at a git
revision, built as a second extension. Row counts and kernels interleave round by round (the one that goes first
rotating), the best of ``--repeats`` rounds is kept; the load average is printed before and after. Both kernels must
give the same bits on every weight (each output is one FMA chain over the inputs in order): checked first.
``--resident`` times the same number of products on one weight that stays in L2 (576 x 576, 1.3 MB): the kernel's
arithmetic and issue rate, with the memory read taken away.

    python benchmarks/kernel_rows.py --threads 1 [--baseline main] [--rows 1,2,3,4,5,6,8,12,16] [--repeats 40]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch
from bandwidth import SHAPES, load_weights

from specfamily.runtime import kernel

ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)
RESIDENT = (576, 576)  # --resident's weight: its packed copy fits a 2 MB L2
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class Rows:
    """Best seconds of one pass of products, per kernel and row count."""

    threads: int
    weights: str
    seconds: dict[str, dict[int, float]] = field(default_factory=dict)  # kernel -> rows -> best s
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after

    def ratios(self, name: str) -> dict[int, float]:
        """t(rows) / t(1) (or over the fewest rows timed)."""
        by_rows = self.seconds[name]
        return {rows: s / by_rows[min(by_rows)] for rows, s in by_rows.items()}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=40, help="best of this many rounds")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts, comma-separated")
    parser.add_argument("--baseline", help="a git revision whose kernel sources are timed beside this checkout's")
    parser.add_argument(
        "--weights",
        choices=("auto", "zoo", "random"),
        default="auto",
        help="zoo: the fetched zoo:smollm2's weights; random: tensors of --shape; auto: zoo if fetched",
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="shapes of random weights")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="cpu: the process's CPU time")
    parser.add_argument(
        "--resident",
        action="store_true",
        help="as many weight elements, from one weight that stays in L2 (the arithmetic alone)",
    )
    args = parser.parse_args(argv)
    fields = args.rows.split(",")
    args.rows = [int(r) for r in fields if r.strip().isdigit()]
    if len(args.rows) != len(fields) or min(args.rows) < 1:
        raise SystemExit("--rows must be positive integers")
    return args


def resident_weights(weights: Sequence[torch.Tensor], shape: tuple[int, int] = RESIDENT) -> list[torch.Tensor]:
    """One ``shape`` weight, repeated until the list holds about as many elements as ``weights``."""
    one = torch.randn(*shape, generator=torch.Generator().manual_seed(3)) * shape[1] ** -0.5
    return [one] * max(1, round(sum(w.numel() for w in weights) / one.numel()))


def baseline_module(revision: str) -> ModuleType:
    """The kernel's sources at ``revision`` (every ``.cpp`` and ``.h`` of its folder then, the main source first),
    built as an extension of its own (a name and a build folder keyed on the revision's text)."""
    root = Path(kernel.__file__).resolve().parents[2]
    csrc = kernel.kernel_source().parent.relative_to(root)
    folder = Path(tempfile.gettempdir()) / f"kernel-rows-{re.sub(r'[^A-Za-z0-9]', '_', revision)}"
    folder.mkdir(exist_ok=True)
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, f"{csrc}/"], cwd=root, check=True, capture_output=True, text=True
    ).stdout.split()
    copies = []
    for name in listed:
        if not name.endswith((".cpp", ".h")):
            continue
        text = subprocess.run(
            ["git", "show", f"{revision}:{name}"], cwd=root, check=True, capture_output=True, text=True
        ).stdout
        copy = folder / Path(name).name
        if not copy.is_file() or copy.read_text(encoding="utf-8") != text:
            copy.write_text(text, encoding="utf-8")
        copies.append(copy)
    main = folder / kernel.kernel_source().name
    sources = [main, *sorted(p for p in copies if p.suffix == ".cpp" and p != main)]
    name = f"{kernel.NAME}_{re.sub(r'[^A-Za-z0-9]', '_', revision)}"
    return kernel.build_extension(name, sources, kernel.build_folder(main, sorted(copies), prefix="kernel_rows"))


def kernels(baseline: str | None) -> dict[str, Callable[..., torch.Tensor]]:
    built = kernel.stream_kernel()
    if not built.available:
        raise SystemExit(f"the stream kernel is not available here: {built.reason}")
    found = {"this checkout": built.module.linear}
    if baseline:
        other = baseline_module(baseline)
        if other.PANEL != built.module.PANEL or other.PACKED_ATTR != built.module.PACKED_ATTR:
            raise SystemExit("the baseline packs weights otherwise: the two would share one packed copy")
        found[baseline] = other.linear
    return found


@torch.inference_mode()
def check_same_bits(
    weights: Sequence[torch.Tensor], linears: dict[str, Callable[..., torch.Tensor]], rows: Sequence[int]
) -> None:
    """Every kernel gives the same bits as the first on every weight, at every row count."""
    generator = torch.Generator().manual_seed(2)
    for k in rows:
        inputs = {d: torch.randn(k, d, generator=generator) for d in {w.shape[1] for w in weights}}
        for weight in weights:
            outputs = [linear(inputs[weight.shape[1]], weight) for linear in linears.values()]
            if not all(torch.equal(outputs[0], out) for out in outputs[1:]):
                raise SystemExit(f"the kernels give other bits at {k} rows on a {tuple(weight.shape)} weight")


@torch.inference_mode()
def time_rows(
    weights: Sequence[torch.Tensor],
    linears: dict[str, Callable[..., torch.Tensor]],
    rows: Sequence[int],
    repeats: int,
    clock: Callable[[], float],
) -> dict[str, dict[int, float]]:
    """kernel -> rows -> best seconds of one product per weight; row counts and kernels interleaved."""
    generator = torch.Generator().manual_seed(1)
    inputs = {(k, d): torch.randn(k, d, generator=generator) for k in rows for d in {w.shape[1] for w in weights}}
    runs = [(name, k) for k in rows for name in linears]
    best: dict[str, dict[int, float]] = {name: {} for name in linears}
    for round_ in range(repeats + 1):  # round 0 warms up (and packs the weights)
        shift = round_ % len(runs)
        for name, k in runs[shift:] + runs[:shift]:
            linear = linears[name]
            start = clock()
            for weight in weights:
                linear(inputs[k, weight.shape[1]], weight)
            elapsed = clock() - start
            if round_:
                best[name][k] = min(best[name].get(k, float("inf")), elapsed)
    return best


def measure(args: argparse.Namespace) -> Rows:
    torch.set_num_threads(args.threads)
    weights, source = load_weights(args)
    if args.resident:
        weights, source = resident_weights(weights), f"one {RESIDENT[0]} x {RESIDENT[1]} weight in L2 ({source}'s size)"
    linears = kernels(args.baseline)
    check_same_bits(weights, linears, args.rows)
    before = os.getloadavg()[0]
    seconds = time_rows(weights, linears, args.rows, args.repeats, CLOCKS[args.clock])
    return Rows(args.threads, source, seconds, (before, os.getloadavg()[0]))


def markdown(report: Rows) -> str:
    rows = sorted(next(iter(report.seconds.values())))
    head = "| kernel | " + " | ".join(f"{k} rows" for k in rows) + " |"
    rule = "|---" * (len(rows) + 1) + "|"
    lines = [
        f"{report.threads} thread(s); weights {report.weights}; load average {report.load[0]:.2f} before, "
        f"{report.load[1]:.2f} after",
        "",
        "ms per pass of products (best of the rounds):",
        "",
        head,
        rule,
    ]
    lines += [
        f"| {name} | " + " | ".join(f"{by_rows[k] * 1e3:.2f}" for k in rows) + " |"
        for name, by_rows in report.seconds.items()
    ]
    lines += ["", "t(rows) / t(1):", "", head, rule]
    lines += [
        f"| {name} | " + " | ".join(f"{report.ratios(name)[k]:.3f}" for k in rows) + " |" for name in report.seconds
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Rows:
    report = measure(parse_args(argv))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
