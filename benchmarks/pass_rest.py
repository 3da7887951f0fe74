"""The non-product part of a plain, a chain and a tree pass, op by op (issue 32: "the rest" of a drafted pass).

For each cache length (``--lengths``) it profiles ``--passes`` passes of each arm with the torch profiler (forward,
greedy verification, commit, and a rollback: one crop in every arm), arms interleaved, and books every op's self
time to an item: the products and norms of the C++ layer loop (``specfamily::product`` / ``specfamily::norm``, named
by ``native_layers.cpp``) and of the lean forward's head and final norm (named here), the fused rope and cache write,
the attention kernel, the element-wise ATen ops (SiLU, products, adds), the views and allocations, the mask's
visibility (comparisons and reductions), the commit's moves, and "host" (the profiled wall time outside every op:
Python, the binding layer, dispatch). Beside them, the products timed alone (every weight once on as many rows,
``benchmarks/pass_goals.py``'s way), interleaved with the passes: in-pass products less these are the part of
pass_goals' "rest" that is products after all. Arms as ``benchmarks/pass_host.py`` feeds them (root + ``--nodes``
tokens; the chain keeps half, the tree its second branch). Times are the profiler's (wall clock), each pass
profiled alone, medians over ``--passes`` passes per arm (an item's median and the total's are taken apart: the
column does not add up exactly); run it on one thread for steadier numbers on a shared machine.

``--base FILE`` (a ``native_layers.cpp``, e.g. ``git show main:specfamily/runtime/csrc/layers/native_layers.cpp``)
builds that source as a second extension and times whole passes (CPU time of this process, or with ``--clock wall``
the wall clock: at 2 threads, where the threads' forks and joins show) of each arm
with this checkout's C++ layer loop and with the base's, interleaved pass by pass, after checking that both give
the same logits bit for bit: an A/B of a change to the loop in one process. ``--base-csrc DIR`` (a checkout's
``specfamily/runtime/csrc``, e.g. ``git archive main specfamily/runtime/csrc | tar -x -C /tmp/base``) does the same
with that checkout's layer loop, stream kernel (its products and norms) and attention kernel, and ``--base-argmax``
has the base arm pick greedy tokens with ``max(-1).indices`` (not the C++ warp's ``greedy_rows``), as main did before
session 23.

    python benchmarks/pass_rest.py --threads 1 --lengths 400 --passes 30 [--base /tmp/base/native_layers.cpp]
    python benchmarks/pass_rest.py --threads 1 --lengths 200,700 --passes 40 \
        --base-csrc /tmp/base/specfamily/runtime/csrc --base-argmax
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from common import set_threads
from pass_cost import Shapes
from pass_host import KINDS, arms_table
from torch.profiler import ProfilerActivity, profile, record_function

from specfamily.core import sampling
from specfamily.core.acceptance import verify_draft
from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft, SamplingConfig
from specfamily.runtime.kernel import build_extension, build_folder, kernel_sources
from specfamily.runtime.matmul import linear_for
from specfamily.runtime.native_layers import NativeLayers

ALONE = "(products timed alone: not in the total)"
ITEMS = {  # op name fragment -> item (first match wins)
    "specfamily::product": "products (layers)",
    "pass::head": "products (head)",
    "specfamily::norm": "norms",
    "pass::final_norm": "norms",
    "specfamily::rope_cache": "rope + cache write",
    "specfamily::attention": "attention",
    "aten::silu": "silu, mul, add",
    "aten::mul": "silu, mul, add",
    "aten::add": "silu, mul, add",
    "aten::index_select": "index_select (rope rows, commit)",
    "aten::copy_": "copies",
    "aten::eq": "mask -> visible",
    "aten::bitwise_or": "mask -> visible",
    "aten::logical_or": "mask -> visible",
    "aten::all": "mask -> visible",
    "aten::any": "mask -> visible",
    "aten::item": "mask -> visible",
    "aten::_local_scalar_dense": "mask -> visible",
    "aten::is_nonzero": "mask -> visible",
    "pass::greedy_rows": "verification ops",
    "aten::argmax": "verification ops",
    "aten::max": "verification ops",
}
VIEWS = ("view", "transpose", "narrow", "slice", "select", "unbind", "as_strided", "reshape", "empty", "unsqueeze",
         "expand", "alias", "detach", "resolve", "lift", "contiguous", "clone", "cat", "arange", "to", "zeros",
         "embedding", "squeeze", "t")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="400", help="cache lengths, comma-separated")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--passes", type=int, default=30, help="profiled passes per arm")
    parser.add_argument("--top", type=int, default=0, help="also print each arm's top ops")
    parser.add_argument("--base", type=Path, help="a native_layers.cpp to A/B this checkout's layer loop against")
    parser.add_argument("--base-csrc", type=Path, help="a checkout's runtime/csrc: A/B its loop and stream kernel")
    parser.add_argument("--base-argmax", action="store_true", help="the base arm's greedy tokens by max(-1).indices")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="the A/B's clock (wall: 2 threads)")
    return parser.parse_args(argv)


def item(name: str) -> str:
    found = next((group for key, group in ITEMS.items() if key in name), None)
    if found is not None:
        return found
    op = name.removeprefix("aten::").strip("_")
    return "views, allocations" if op in VIEWS or op.split("_")[0] in VIEWS else "other ops"


def name_lean(target: Target) -> None:
    """The lean forward's head and final norm (Python calls of the stream kernel) and greedy verification's C++ argmax
    (``sampling.greedy_rows``) named to the profiler."""
    lean = target.lean

    def named(inner: Callable, label: str) -> Callable:
        def call(*args, **kwargs):
            with record_function(label):
                return inner(*args, **kwargs)

        return call

    lean._linear = named(lean._linear, "pass::head")
    lean._norm_fn = named(lean._norm_fn, "pass::final_norm")
    sampling.greedy_rows = named(sampling.greedy_rows, "pass::greedy_rows")


def arms(target: Target, length: int, shapes: Shapes) -> dict[str, tuple]:
    """A cache of ``length`` random tokens; per arm (root, draft, accepted path)."""
    ids = torch.randint(0, min(target.vocab_size, 30000), (length + shapes.nodes + 1,),
                        generator=torch.Generator().manual_seed(length))
    target.reset()
    target.forward(ids[:length])
    target.commit([])
    ahead, root = ids[length + 1 :], ids[length : length + 1]
    tree = ahead.clone()
    tree[0] = (tree[0] + 1) % target.vocab_size
    return {"plain": (root, Draft.empty(), []), "chain": (root, Draft.chain(ahead), shapes.chain_path),
            "tree": (root, Draft(tree, torch.tensor(shapes.tree_parents)), shapes.tree_path)}


def profiled(target: Target, arm: tuple) -> tuple[dict[str, float], list]:
    """item -> ms of one pass of ``arm`` (profiled alone), and its ops (name, calls, ms)."""
    root, draft, path = arm
    length, greedy = target.cached_length, SamplingConfig(temperature=0.0)
    gc.collect()  # a collection inside the pass (the profiler's events feed it) would land in "host", a few ms
    gc.disable()
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            out = target.forward(root, draft)
            verify_draft(draft, out.logits, greedy, torch.Generator().manual_seed(0))
            target.commit(path)
            target.rollback(length)  # one crop, the same in every arm
            wall = time.perf_counter() - start
    finally:
        gc.enable()
    items: dict[str, float] = defaultdict(float)
    ops = []
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3
        items[item(event.key)] += ms
        ops.append((event.key, event.count, ms))
    items["host (Python, binding, dispatch)"] = wall * 1e3 - sum(items.values())
    items["total"] = wall * 1e3
    return items, ops


class Alone:
    """Every linear weight once (the tied head once) on ``rows`` random rows, with the lean forward's product: the
    products as ``benchmarks/pass_goals.py`` times them apart from the pass (whose "rest" is the pass less these)."""

    def __init__(self, target: Target, rows: int) -> None:
        self.linear = linear_for(target.matmul)
        modules = target.model.modules()
        self.weights = list({id(m.weight): m.weight for m in modules if isinstance(m, torch.nn.Linear)}.values())
        self.inputs = {w.shape[1]: torch.randn(1, rows, w.shape[1]) for w in self.weights}

    def __call__(self) -> float:
        """ms of one round over every weight (wall clock, as the profiler's)."""
        start = time.perf_counter()
        for weight in self.weights:
            self.linear(self.inputs[weight.shape[1]], weight, None)
        return (time.perf_counter() - start) * 1e3


@torch.inference_mode()
def measure(target: Target, length: int, shapes: Shapes, passes: int, top: int,
            out: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """arm -> item -> median ms over ``passes`` passes of each arm (arms interleaved and rotated, each pass profiled
    alone: on a shared machine the median of each item drops the passes a neighbour preempted)."""
    cases = arms(target, length, shapes)
    for arm in cases.values():  # warm-up: builds, layouts, rope table
        profiled(target, arm)
    alone = {"plain": Alone(target, 1), "chain": Alone(target, shapes.nodes + 1)}
    alone["tree"] = alone["chain"]
    by: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in KINDS}
    ops: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in KINDS}
    for round_ in range(passes):
        for kind in KINDS[round_ % 3 :] + KINDS[: round_ % 3]:
            by[kind][ALONE].append(alone[kind]())
            items, pass_ops = profiled(target, cases[kind])
            for name, ms in items.items():
                by[kind][name].append(ms)
            for name, calls, ms in pass_ops:
                ops[kind][f"{name} x{calls}"].append(ms)
    if top:
        for kind in KINDS:
            out(f"{kind} at L={length}: top ops (name x calls per pass, median ms per pass)")
            ranked = sorted(((statistics.median(v), name) for name, v in ops[kind].items()), reverse=True)
            for ms, name in ranked[:top]:
                out(f"  {name:50s} {ms:8.3f}")
    return {kind: {name: statistics.median(v) for name, v in items.items()} for kind, items in by.items()}


def base_layers(target: Target, source: Path, csrc: Path | None = None) -> NativeLayers:
    """``source`` built as its own extension (another name and folder), over the target's lean forward; with
    ``csrc`` (a checkout's ``runtime/csrc``), its layer loop calling its own stream kernel's products and norms."""
    stream = attention = None
    if csrc is not None:
        source = csrc / "layers" / "native_layers.cpp"
        kernel = csrc / "stream_linear.cpp"
        sources = kernel_sources(kernel)
        stream = build_extension("specfamily_stream_linear_base", sources,
                                 build_folder(kernel, [*sources, *sorted(csrc.glob("*.h"))], "stream_base"))
        attend = csrc / "attention" / "attention.cpp"
        if target.lean.attention is not None and attend.is_file():  # its attention kernel too
            headers = [*sorted(attend.parent.glob("*.h")), csrc / "cpu_isa.h"]
            attention = build_extension("specfamily_attention_base", [attend],
                                        build_folder(attend, [attend, *headers], "attention_base"))
    module = build_extension("specfamily_native_layers_base", [source], build_folder(source, [source], "native_base"))
    return NativeLayers(target.lean, module, stream, attention)


@contextlib.contextmanager
def max_indices(on: bool):
    """While ``on``: greedy tokens by ``max(-1).indices`` (``sampling.greedy_tokens`` without the C++ warp)."""
    kept = sampling.greedy_rows
    if on:
        sampling.greedy_rows = lambda logits: None
    try:
        yield
    finally:
        sampling.greedy_rows = kept


@torch.inference_mode()
def ab(target: Target, length: int, shapes: Shapes, base: NativeLayers, passes: int,
       base_argmax: bool = False, clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """arm -> [median ms (``clock``) of a whole pass (forward, greedy verification, commit) with this checkout's loop,
    with the base's (``base_argmax``: its greedy tokens by ``max(-1).indices``)]; raises where the two loops' logits or
    accepted paths differ."""
    cases, ours, greedy = arms(target, length, shapes), target.lean.native, SamplingConfig(temperature=0.0)
    loops = (ours, base)
    times: dict[str, list[list[float]]] = {k: [[], []] for k in KINDS}
    for round_ in range(passes + 2):
        for kind in KINDS[round_ % 3 :] + KINDS[: round_ % 3]:
            root, draft, path = cases[kind]
            logits, verdicts = [], []
            for which in ((0, 1) if round_ % 2 else (1, 0)):
                target.lean.native = loops[which]
                with max_indices(base_argmax and which == 1):
                    start = clock()
                    out = target.forward(root, draft)
                    verdicts.append(verify_draft(draft, out.logits, greedy, torch.Generator().manual_seed(0)))
                    target.commit(path)
                    elapsed = clock() - start
                target.rollback(length)
                logits.append(out.logits)
                if round_ >= 2:
                    times[kind][which].append(elapsed * 1e3)
            if not torch.equal(*logits) or verdicts[0] != verdicts[1]:
                raise AssertionError(f"{kind}: the two layer loops' logits or verdicts differ")
    target.lean.native = ours
    return {kind: [statistics.median(v) for v in pair] for kind, pair in times.items()}


def ab_table(length: int, medians: dict[str, list[float]], clock: str = "cpu") -> str:
    rows = [f"cache {length}: whole pass, {clock.upper()} ms (median), this checkout's layer loop against the base's",
            "| arm | this | base | this - base |", "| --- | ---: | ---: | ---: |"]
    rows += [f"| {kind} | {a:.3f} | {b:.3f} | {a - b:+.3f} |" for kind, (a, b) in medians.items()]
    return "\n".join(rows)


def table(length: int, medians: dict[str, dict[str, float]]) -> str:
    names = sorted({n for items in medians.values() for n in items} - {"total", ALONE},
                   key=lambda n: -(medians["chain"].get(n, 0.0) - medians["plain"].get(n, 0.0)))
    return arms_table(f"cache {length}: ms per pass (profiler, medians over passes)", "item", (*names, "total", ALONE),
                      lambda k, name: medians[k].get(name, 0.0))


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    target = load_target(args.model, matmul=args.matmul)
    kept = sampling.greedy_rows
    name_lean(target)
    try:
        return run(args, target, out)
    finally:
        sampling.greedy_rows = kept  # name_lean's profiler label, off again


def run(args: argparse.Namespace, target: Target, out: Callable[[str], None]) -> dict:
    shapes = Shapes(args.nodes)
    base = None
    if args.base is not None or args.base_csrc is not None:
        base = base_layers(target, args.base, args.base_csrc)
    result = {}
    for length in (int(v) for v in args.lengths.split(",")):
        if base is not None:
            clock = time.perf_counter if args.clock == "wall" else time.process_time
            out(ab_table(length, ab(target, length, shapes, base, args.passes, args.base_argmax, clock), args.clock))
            continue
        result[length] = measure(target, length, shapes, args.passes, args.top, out)
        out(table(length, result[length]))
    return result


if __name__ == "__main__":
    main()
