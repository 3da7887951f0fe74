"""Where a pass's time goes, step by step between its products (issue 32: what bounds the plain pass).

The profiler (``benchmarks/pass_rest.py``) books time to ATen ops, and its own cost per op is of the order of the
ops it times. This builds a copy of the C++ layer loop and the stream kernel with ``SF_PASS_MARKS`` on
(``runtime/csrc/pass_marks.h``: a timestamp at each step of a layer and of each product call, nothing else changed;
the default builds compile the marks out) and runs whole passes through it (forward, greedy verification, commit,
rolled back), the arms of ``pass_rest`` at each cache length. Per step (``norm1``, ``qkv: region start -> region
end``, ``rope+cache``, ``attention``, ...) it prints the median per occurrence (us) and the sum per pass (ms); then
the pass split in three: the products' parallel regions, the layer loop's serial work between them (the main thread
alone, the other threads waiting), and what runs outside the layer loop (embedding, head, verification, commit).
Wall clock, the arms interleaved pass by pass after ``--warmup`` passes.

    python benchmarks/pass_marks.py --threads 2 --lengths 200,700 --passes 40
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from common import set_threads
from pass_cost import Shapes
from pass_rest import arms

from specfamily.core.acceptance import verify_draft
from specfamily.core.target import Target, load_target
from specfamily.core.types import SamplingConfig
from specfamily.runtime.kernel import build_extension, build_folder, kernel_source, kernel_sources
from specfamily.runtime.native_layers import NativeLayers, native_source

KINDS = ("plain", "chain", "tree")
REGION = "region start -> region end"
PRODUCT_STEPS = {"products", "checks", "packed copy", "output", "region start", "region end", "products done"}
CSRC = native_source().parent.parent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default="200,700", help="cache lengths, comma-separated")
    parser.add_argument("--nodes", type=int, default=4, help="draft tokens of the chain and tree arms")
    parser.add_argument("--passes", type=int, default=40, help="timed passes per arm")
    parser.add_argument("--warmup", type=int, default=5, help="untimed passes per arm first")
    return parser.parse_args(argv)


def marked_sources(into: Path) -> Path:
    """A copy of the package's ``runtime/csrc`` in ``into`` with the marks on; files rewritten only where they
    differ (the build keys on their text)."""
    for source in sorted(CSRC.rglob("*")):
        if source.suffix not in {".cpp", ".h"}:
            continue
        text = source.read_text(encoding="utf-8")
        if source.name == "pass_marks.h":
            text = "#define SF_PASS_MARKS 1\n" + text
        copy = into / source.relative_to(CSRC)
        if not copy.is_file() or copy.read_text(encoding="utf-8") != text:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text, encoding="utf-8")
    return into


def marked_layers(target: Target) -> tuple[NativeLayers, list]:
    """The target's layer loop built from the marked copy, over the marked stream kernel (the head's product too);
    and both modules."""
    csrc = marked_sources(build_folder(kernel_source()).parent / "pass-marks-src")  # beside the kernels' builds
    headers = sorted(csrc.glob("*.h"))
    kernel = csrc / "stream_linear.cpp"
    stream = build_extension("specfamily_stream_linear_marked", kernel_sources(kernel),
                             build_folder(kernel, [*kernel_sources(kernel), *headers], "stream_marked"))
    loop = csrc / "layers" / "native_layers.cpp"
    module = build_extension("specfamily_native_layers_marked", [loop],
                             build_folder(loop, [loop, *headers], "native_marked"))
    target.lean._linear = stream.linear  # the head's product (the same kernel's bits), marked too
    return NativeLayers(target.lean, module, stream), [stream, module]


def taken(modules: list) -> list[tuple[str, float]]:
    """Every module's marks since the last call, in time order."""
    return sorted((mark for module in modules for mark in module._pass_marks()), key=lambda mark: mark[1])


def labelled(marks: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """(step, seconds since the mark before) for one pass's marks: a product call's inner steps named after the
    layer step that follows them (``qkv: region start -> region end``)."""
    out, pending = [], []
    for (before, t0), (step, t1) in zip(marks, marks[1:], strict=False):
        if step in PRODUCT_STEPS:
            pending.append((f"{before} -> {step}", t1 - t0))
            continue
        out += [(f"{step}: {inner}", seconds) for inner, seconds in pending]
        out.append((step if before not in PRODUCT_STEPS else f"{step}: return", t1 - t0))
        pending = []
    return out + [(f"head: {inner}", seconds) for inner, seconds in pending]  # the LM head's product comes last


def run_arm(target: Target, arm: tuple, modules: list, length: int) -> tuple[float, list[tuple[str, float]], float]:
    """One pass: (its wall seconds, its labelled steps, the seconds from its first mark (the first layer's start) to
    its last (the head's product returned))."""
    root, draft, path = arm
    taken(modules)
    start = time.perf_counter()
    out = target.forward(root, draft)
    verify_draft(draft, out.logits, SamplingConfig(temperature=0.0), torch.Generator().manual_seed(0))
    target.commit(path)
    elapsed = time.perf_counter() - start
    target.rollback(length)
    marks = taken(modules)
    return elapsed, labelled(marks), marks[-1][1] - marks[0][1]


@torch.inference_mode()
def measure(target: Target, length: int, shapes: Shapes, passes: int, warmup: int, modules: list) -> dict:
    """kind -> {"parts": {part: median ms a pass}, "steps": {label: (median us an occurrence, mean ms a pass)}}."""
    cases = arms(target, length, shapes)
    parts: dict[str, dict[str, list[float]]] = {kind: defaultdict(list) for kind in KINDS}
    steps: dict[str, dict[str, list[float]]] = {kind: defaultdict(list) for kind in KINDS}
    order: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for round_ in range(warmup + passes):
        for kind in KINDS[round_ % 3 :] + KINDS[: round_ % 3]:
            wall, labels, loop = run_arm(target, cases[kind], modules, length)
            if round_ < warmup:
                continue
            regions = sum(seconds for label, seconds in labels if label.endswith(REGION)) * 1e3
            for part, ms in (("whole pass", wall * 1e3), ("products' parallel regions", regions),
                             ("serial work between the first mark and the last", loop * 1e3 - regions),
                             ("outside the marks (embedding, rope rows, verification, commit)", (wall - loop) * 1e3)):
                parts[kind][part].append(ms)
            for label, seconds in labels:
                if label not in steps[kind]:
                    order[kind].append(label)
                steps[kind][label].append(seconds * 1e6)
    return {kind: {"parts": {part: statistics.median(ms) for part, ms in parts[kind].items()},
                   "steps": {label: (statistics.median(steps[kind][label]), sum(steps[kind][label]) / passes / 1e3)
                             for label in order[kind]}} for kind in KINDS}


def report(length: int, result: dict, out: Callable[[str], None]) -> None:
    out(f"cache {length}: per step, median us an occurrence / mean ms a pass (wall)")
    out("| step | " + " | ".join(KINDS) + " |")
    out("| --- |" + " ---: |" * len(KINDS))
    labels = list(dict.fromkeys(label for kind in KINDS for label in result[kind]["steps"]))
    for label in labels:
        cells = [result[kind]["steps"].get(label) for kind in KINDS]
        out(f"| {label} | " + " | ".join("-" if c is None else f"{c[0]:.1f} / {c[1]:.3f}" for c in cells) + " |")
    out(f"cache {length}: the pass split, ms (medians over passes)")
    out("| part | " + " | ".join(KINDS) + " |")
    out("| --- |" + " ---: |" * len(KINDS))
    for part in result[KINDS[0]]["parts"]:
        out(f"| {part} | " + " | ".join(f"{result[kind]['parts'][part]:.2f}" for kind in KINDS) + " |")


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise SystemExit("pass_marks: needs a C++ compiler to build the marked copy")
    target = load_target(args.model, matmul="stream")
    marked, modules = marked_layers(target)
    target.lean.native = marked
    results = {}
    for length in (int(x) for x in args.lengths.split(",")):
        results[length] = measure(target, length, Shapes(args.nodes), args.passes, args.warmup, modules)
        report(length, results[length], out)
    return results


if __name__ == "__main__":
    main()
