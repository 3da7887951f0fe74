"""What one whole target pass costs, plain and drafted, over the cache lengths a run reaches, and where it goes.

In one process at a fixed thread count, for each cache length L (``--lengths``) this times ``Target.forward`` plus
``commit`` (and a ``rollback`` to L, not timed) for:

- ``plain``: the root alone (a decode step);
- ``chain``: the root and a chain of ``--nodes`` draft tokens, half of them accepted (the commit crops);
- ``tree``: the root and a tree of ``--nodes`` nodes, two branches, whose accepted path is the second branch (the
  commit rewrites the cache: the case a chain never exercises);

the kinds interleaved pass by pass, each pass on ``time.process_time`` (CPU time of this process: on one thread, a
neighbour's load shows less than on a wall clock), and prints the median ms, the drafted / plain ratios the goals
name, and the plain pass over the floor (bytes of the weights one pass reads / the measured read bandwidth, as
``benchmarks/bandwidth.py`` measures them). ``--profile`` adds the torch profiler's breakdown of one kind's passes
at the longest length, grouped (matmul, attention, norm, rope, mask, cache, other ops, Python and dispatch).
``--compile-pass`` times the same passes through ``Target(compile="pass")`` (the compiled whole pass) interleaved
with the eager ones, after its first passes (whose wall time, the compile, it prints with the graphs compiled and the
largest logit difference from the eager pass). ``--native`` times the layer loop in C++ (``Target(native_layers=True)``,
``specfamily.runtime.native_layers``) interleaved pass by pass with the Python loop (``native_layers=False``, then the
main table's target) on the same model, after checking that both give the same logits, bit for bit; ``--profile``
then profiles the native target.

    python benchmarks/pass_cost.py --threads 1 [--model zoo:smollm2] [--matmul stream] [--lengths 128,384,768]
        [--compile-pass] [--native]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from bandwidth import read_bandwidth

from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft
from specfamily.runtime.matmul import linear_for

KINDS = ("plain", "chain", "tree")
COMPILED = " compiled"  # the suffix of the compiled whole pass's timings
NATIVE = " native"  # the suffix of the native layer loop's timings
GROUPS = {  # profiler op name fragment -> section (first match wins)
    "specfamily::attention": "attention",  # the batch-invariant attention kernel (runtime/attention.py)
    "specfamily::product": "matmul", "specfamily::norm": "norm",  # the C++ layer loop's stream-kernel calls
    "specfamily::rope_cache": "rope",  # its fused rope and cache write
    "stream_linear": "matmul", "linear": "matmul", "addmm": "matmul", "mm": "matmul",
    "scaled_dot_product": "attention", "_flash_attention": "attention", "bmm": "attention",
    "softmax": "attention", "baddbmm": "attention",
    "rms_norm": "norm", "rsqrt": "norm", "pow": "norm", "mean": "norm",
    "cos": "rope", "sin": "rope",
    "zeros": "mask", "fill_": "mask", "where": "mask",
    "index_select": "cache", "copy_": "cache", "slice": "cache",
    "embedding": "embed",
}


@dataclass
class Shapes:
    """The draft of each drafted kind: ``nodes`` tokens, and the path its commit keeps."""

    nodes: int
    chain_path: list[int] = field(init=False)
    tree_parents: list[int] = field(init=False)
    tree_path: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.chain_path = list(range(self.nodes // 2))
        # two branches from the root, nodes alternating between them: 0, 1 roots; 2 under 0, 3 under 1, ...
        self.tree_parents = [-1 if i < 2 else i - 2 for i in range(self.nodes)]
        self.tree_path = list(range(1, self.nodes, 2))  # the second branch: every entry moves in the cache


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream", help="the lean forward's matmul kind (the default run's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="128,384,768", help="cache lengths, comma-separated")
    parser.add_argument("--nodes", type=int, default=4, help="draft tokens fed with the root")
    parser.add_argument("--repeats", type=int, default=21, help="timed passes per kind and length (median)")
    parser.add_argument("--profile", action="store_true", help="also break one kind's passes down by section")
    parser.add_argument("--profile-kind", choices=KINDS, default="tree")
    parser.add_argument("--compile", action="store_true", help="Target(compile=True), where the build has it")
    parser.add_argument("--compile-pass", action="store_true",
                        help="also time the same passes through Target(compile='pass') (the compiled whole pass), "
                             "interleaved with the eager ones, and give its first-compile time and logits' difference")
    parser.add_argument("--native", action="store_true",
                        help="time the layer loop in C++ against the Python loop, interleaved (same model)")
    parser.add_argument("--buckets", default=None,
                        help="--compile-pass: fed-row buckets, comma-separated (default: the path's own, 1,2,4,...,64)")
    parser.add_argument("--grouped", action="store_true",
                        help="also time chain and tree passes unpacked (sdpa's grouped indexing), interleaved")
    parser.add_argument("--gb", type=float, default=0.5, help="size of the bandwidth probe tensor, GB")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[Target, str]:
    """The target, and (``--compile``) what compiling cost: the wall seconds of its first pass, and its state."""
    target = load_target(args.model, device="cpu", matmul=args.matmul)
    if not args.compile:
        return target, ""
    if "compile" not in inspect.signature(Target).parameters:
        raise SystemExit("--compile: this build's Target has no compile option")
    target = Target(target.model, target.tokenizer, matmul=args.matmul, compile=True)
    start = time.perf_counter()
    prefill(target, 16)
    one_pass(target, Shapes(args.nodes), "tree", 16, torch.arange(args.nodes + 1))
    rotate = target.lean.rotate if target.lean is not None else None
    state = "no lean forward" if rotate is None else "compiled" if rotate.active else f"eager: {rotate.reason}"
    return target, f"; compile: first passes {time.perf_counter() - start:.1f} s wall, {state}"


def compiled_target(target: Target, args: argparse.Namespace, shapes: Shapes, lengths: list[int]) -> tuple[Target, str]:
    """The same model through the compiled whole pass, its first passes of each kind run (compiling one graph per
    fed-row bucket), and a note: their wall seconds, the graphs, and the largest logit difference from the eager
    target over one pass of each kind at each length."""
    compiled = Target(target.model, target.tokenizer, matmul=args.matmul, compile="pass")
    if args.buckets:
        compiled.compiled_pass.buckets = tuple(int(x) for x in args.buckets.split(","))
    tokens = torch.arange(1, shapes.nodes + 2)
    started = time.perf_counter()
    prefill(compiled, lengths[0])
    for kind in KINDS:
        one_pass(compiled, shapes, kind, lengths[0], tokens)
    first = time.perf_counter() - started
    state = compiled.compiled_pass
    if not state.active:
        raise SystemExit(f"--compile-pass: the compiled pass fell back to eager: {state.reason}")
    diff = max(logit_difference(target, compiled, shapes, kind, length, tokens) for kind in KINDS for length in lengths)
    return compiled, (f"compiled whole pass: first passes (compiling {len(state.shapes)} graphs, fed rows "
                      f"{sorted(rows for rows, _ in state.shapes)}) {first:.1f} s wall; largest |logit difference| "
                      f"from the eager pass {diff:.3g} (one pass of each kind at each length)")


@torch.inference_mode()
def logit_difference(eager: Target, compiled: Target, shapes: Shapes, kind: str, length: int,
                     tokens: torch.Tensor) -> float:
    """max |logits(eager) - logits(compiled)| over one pass of ``kind`` over ``length`` cached tokens."""
    outputs = []
    for target in (eager, compiled):
        prefill(target, length)
        draft = None if kind == "plain" else Draft.chain(tokens[1 : shapes.nodes + 1]) if kind == "chain" else Draft(
            tokens[1 : shapes.nodes + 1], torch.tensor(shapes.tree_parents))
        outputs.append(target.forward(tokens[:1], draft).logits)
        target.commit([])
    return float((outputs[0] - outputs[1]).abs().max())


def native_targets(target: Target, args: argparse.Namespace, shapes: Shapes,
                   lengths: list[int]) -> tuple[Target, Target, str]:
    """The Python loop's target and the native loop's, on ``target``'s model, and a note: whether one pass of each
    kind at each length gave bit-identical logits, and how many passes ran natively."""
    python = Target(target.model, target.tokenizer, matmul=args.matmul, native_layers=False)
    native = Target(target.model, target.tokenizer, matmul=args.matmul, native_layers=True)
    if native.lean is None or native.lean.native is None:
        raise SystemExit("--native: the layer loop in C++ is not available here (see the warning above)")
    tokens = torch.arange(1, shapes.nodes + 2)
    same = all(logit_difference(python, native, shapes, kind, length, tokens) == 0.0
               for kind in KINDS for length in lengths)
    return python, native, (f"native layer loop: logits {'bit-identical to' if same else 'DIFFERENT from'} the Python "
                            f"loop's (one pass of each kind at each length; {native.lean.native.calls} native passes)")


def native_table(results: dict[int, dict[str, float]], floor: float, alone: dict[int, float], note: str) -> str:
    """The native loop's ms and ratios by cache length and kind, against the Python loop timed interleaved."""
    one, _ = sorted(alone)
    lines = ["\n" + note, "| cache L | plain native ms | chain native ms | tree native ms | chain / plain "
             "| tree / plain | plain / floor | plain / products | plain native / Python | chain native / Python "
             "| tree native / Python |", "|---:" * 11 + "|"]
    for length, by_kind in results.items():
        plain, chain, tree = (by_kind[kind + NATIVE] for kind in KINDS)
        lines.append(f"| {length} | {plain * 1e3:.2f} | {chain * 1e3:.2f} | {tree * 1e3:.2f} | {chain / plain:.3f} "
                     f"| {tree / plain:.3f} | {plain / floor:.2f} | {plain / alone[one]:.2f} | "
                     + " | ".join(f"{by_kind[kind + NATIVE] / by_kind[kind]:.3f}" for kind in KINDS) + " |")
    return "\n".join(lines)


def compiled_table(results: dict[int, dict[str, float]], note: str) -> str:
    """Compiled against eager ms by cache length and kind, timed interleaved in the same run."""
    lines = ["\n" + note, "| cache L | " + " | ".join(f"{k} eager ms | {k} compiled ms | {k} compiled / eager"
                                                     for k in KINDS) + " |", "|---:" * (1 + 3 * len(KINDS)) + "|"]
    for length, by_kind in results.items():
        cells = [f"{by_kind[k] * 1e3:.2f} | {by_kind[k + COMPILED] * 1e3:.2f} "
                 f"| {by_kind[k + COMPILED] / by_kind[k]:.3f}"
                 for k in KINDS]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prefill(target: Target, length: int, seed: int = 0) -> None:
    """A fresh request whose cache holds ``length`` tokens (random ids: a pass's cost does not depend on them)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (length,), generator=generator)
    target.reset()
    target.forward(ids)
    target.commit([])


def one_pass(target: Target, shapes: Shapes, kind: str, length: int, tokens: torch.Tensor) -> float:
    """CPU seconds of one forward + commit of ``kind`` over ``length`` cached tokens (then rolled back to it)."""
    root = tokens[:1]
    if kind == "plain":
        draft, path = None, []
    elif kind == "chain":
        draft, path = Draft.chain(tokens[1 : shapes.nodes + 1]), shapes.chain_path
    else:
        draft, path = Draft(tokens[1 : shapes.nodes + 1], torch.tensor(shapes.tree_parents)), shapes.tree_path
    start = time.process_time()
    target.forward(root, draft)
    target.commit(path)
    elapsed = time.process_time() - start
    target.rollback(length)
    return elapsed


def time_length(targets: dict[str, Target], shapes: Shapes, length: int, repeats: int) -> dict[str, float]:
    """kind -> median seconds over ``repeats`` passes at one cache length, kinds interleaved (after a warm-up);
    ``targets``: "" the target, or a suffix naming another (" grouped": the same model, verify passes unpacked)."""
    for target in targets.values():
        prefill(target, length)
    runs = [(suffix, kind) for suffix in targets for kind in KINDS
            if suffix in ("", COMPILED, NATIVE) or kind != "plain"]
    generator = torch.Generator().manual_seed(length)
    times: dict[str, list[float]] = {kind + suffix: [] for suffix, kind in runs}
    for round_ in range(repeats + 1):
        tokens = torch.randint(0, targets[""].vocab_size, (shapes.nodes + 1,), generator=generator)
        shift = round_ % len(runs)
        for suffix, kind in runs[shift:] + runs[:shift]:
            elapsed = one_pass(targets[suffix], shapes, kind, length, tokens)
            if round_:
                times[kind + suffix].append(elapsed)
    return {kind: statistics.median(values) for kind, values in times.items()}


@torch.inference_mode()
def products(target: Target, rows: int, repeats: int) -> float:
    """Median CPU seconds of the pass's weight products alone: ``rows`` rows through every linear weight once, with
    the lean forward's kind of product (the part of a pass the stream kernel already runs near the floor)."""
    linear = linear_for(target.matmul)
    weights = list({id(m.weight): m.weight for m in target.model.modules() if isinstance(m, torch.nn.Linear)}.values())
    generator = torch.Generator().manual_seed(rows)
    inputs = {w.shape[1]: torch.randn(1, rows, w.shape[1], generator=generator) for w in weights}
    times = []
    for round_ in range(repeats + 1):
        start = time.process_time()
        for weight in weights:
            linear(inputs[weight.shape[1]], weight, None)
        if round_:
            times.append(time.process_time() - start)
    return statistics.median(times)


def weight_bytes(target: Target) -> int:
    """Bytes of every linear weight one pass reads (the tied head once)."""
    seen, total = set(), 0
    for module in target.model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel() * module.weight.element_size()
    return total


def section(name: str) -> str:
    lowered = name.lower()
    return next((group for key, group in GROUPS.items() if key in lowered), "other ops")


def profile(target: Target, shapes: Shapes, kind: str, length: int, passes: int = 10) -> tuple[dict[str, float], list]:
    """Section -> ms per pass of ``kind`` at ``length`` (self CPU time by op; the stream kernel's products and norms
    are no aten ops: the C++ layer loop names them to the profiler, the lean forward's head and final norm fall in
    "kernel calls, Python and dispatch", the pass's wall time outside every op), and
    the top ops."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    prefill(target, length)
    tokens = torch.randint(0, target.vocab_size, (shapes.nodes + 1,), generator=torch.Generator().manual_seed(7))
    one_pass(target, shapes, kind, length, tokens)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(passes):
            one_pass(target, shapes, kind, length, tokens)
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if not e.key.startswith("aten::_") or "attention" in e.key]
    sections: dict[str, float] = {}
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3 / passes
        sections[section(event.key)] = sections.get(section(event.key), 0.0) + ms
    sections["kernel calls, Python and dispatch"] = wall * 1e3 / passes - sum(sections.values())
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    return sections, [(e.key, e.count // passes, e.self_cpu_time_total / 1e3 / passes) for e in top]


def table(results: dict[int, dict[str, float]], floor: float, alone: dict[int, float]) -> str:
    """ms and ratios by cache length; the last columns: each kind's pass minus its products timed alone."""
    one, fed = sorted(alone)
    lines = ["| cache L | plain ms | chain ms | tree ms | chain / plain | tree / plain | plain / floor "
             "| plain / products | plain - products | chain - products | tree - products |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for length, by_kind in results.items():
        plain, chain, tree = (by_kind[kind] for kind in KINDS)
        lines.append(f"| {length} | {plain * 1e3:.2f} | {chain * 1e3:.2f} | {tree * 1e3:.2f} | {chain / plain:.3f} "
                     f"| {tree / plain:.3f} | {plain / floor:.2f} | {plain / alone[one]:.2f} "
                     f"| {(plain - alone[one]) * 1e3:.2f} | {(chain - alone[fed]) * 1e3:.2f} "
                     f"| {(tree - alone[fed]) * 1e3:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> dict[int, dict[str, float]]:
    args = parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    torch.set_num_threads(args.threads)
    target, compiled = build(args)
    shapes = Shapes(args.nodes)
    bandwidth = read_bandwidth(args.gb, 5)
    floor = weight_bytes(target) / bandwidth
    started = time.perf_counter()
    targets = {"": target}
    if args.grouped:
        if getattr(target.lean, "pack_queries", None) is None:
            raise SystemExit("--grouped: this build's lean forward does not pack verify passes")
        targets[" grouped"] = Target(target.model, target.tokenizer, matmul=args.matmul)
        targets[" grouped"].lean.pack_queries = False
    compiled_note = ""
    if args.compile_pass:
        targets[COMPILED], compiled_note = compiled_target(target, args, shapes, lengths)
    native_note = ""
    if args.native:
        targets[""], targets[NATIVE], native_note = native_targets(target, args, shapes, lengths)
    results = {length: time_length(targets, shapes, length, args.repeats) for length in lengths}
    alone = {rows: products(target, rows, args.repeats) for rows in (1, args.nodes + 1)}
    out(f"{args.model}, matmul {target.matmul}, {args.threads} thread(s), {args.nodes} draft nodes "
        f"(tree parents {shapes.tree_parents}, kept path {shapes.tree_path}; chain keeps {shapes.chain_path}); "
        f"median of {args.repeats} interleaved passes, process CPU time; weights {weight_bytes(target) / 1e6:.0f} MB, "
        f"read bandwidth {bandwidth / 1e9:.1f} GB/s, floor {floor * 1e3:.2f} ms; timed in "
        f"{time.perf_counter() - started:.0f} s{compiled}")
    out("products alone (every linear weight once): " + ", ".join(
        f"{rows} row(s) {seconds * 1e3:.2f} ms" for rows, seconds in alone.items())
        + f"; {alone[args.nodes + 1] / alone[1]:.2f}x from 1 to {args.nodes + 1} rows")
    out(table(results, floor, alone))
    if args.grouped:
        out("\npacked verify passes against the same passes unpacked (sdpa's grouped indexing), same run:\n"
            "| cache L | chain grouped ms | tree grouped ms | chain packed / grouped | tree packed / grouped |\n"
            "|---:|---:|---:|---:|---:|")
        for length, by_kind in results.items():
            chain, tree = by_kind["chain grouped"], by_kind["tree grouped"]
            out(f"| {length} | {chain * 1e3:.2f} | {tree * 1e3:.2f} | {by_kind['chain'] / chain:.3f} "
                f"| {by_kind['tree'] / tree:.3f} |")
    if args.compile_pass:
        out(compiled_table(results, compiled_note))
    if args.native:
        out(native_table(results, floor, alone, native_note))
    if args.profile:
        profiled = targets.get(NATIVE, target)
        sections, top = profile(profiled, shapes, args.profile_kind, lengths[-1])
        out(f"\nprofiled: the {'native' if profiled is not target else 'Python'} layer loop")
        out(f"\n{args.profile_kind} pass at L={lengths[-1]}, torch profiler, ms per pass (self CPU time):")
        out("| section | ms |\n|---|---:|")
        for name, ms in sorted(sections.items(), key=lambda item: -item[1]):
            out(f"| {name} | {ms:.2f} |")
        out("\n| op | calls per pass | ms per pass |\n|---|---:|---:|")
        for key, calls, ms in top:
            out(f"| {key} | {calls} | {ms:.2f} |")
    return results


if __name__ == "__main__":
    sys.exit(main() and 0)
