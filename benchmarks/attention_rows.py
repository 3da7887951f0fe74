"""The attention kernel alone at a few fed rows: t(rows) / t(1) per cache length (issue 32).

A drafted pass feeds 4-8 rows, a plain one 1; the kernel reads each layer's cache once for all of them, so a chain
should cost little more than a plain pass. This script times, per cache length of ``--lengths``, one pass's worth of
calls (``--layers`` layers, each with caches of its own so they are read from past L2 as in a pass: SmolLM2's 9 query
heads on 3 key/value heads, 64 wide, by default) at each row count of ``--rows``: one row sees the whole cache (the
plain pass, no mask), r rows a chain's causal tail (``--shape tree``: a root and two branches, pass_goals' tree).
With ``--baseline REF`` the kernel's sources at a git revision are built as a second extension and timed beside this
checkout's; both must give the same bits (checked first) unless ``--allow-new-bits``. Kernels, lengths and row
counts interleave round by round (the order rotating); the best and the median of ``--repeats`` rounds are kept, on
``--clock`` (cpu: the process's CPU time, for one thread); the load average is printed before and after.

    python benchmarks/attention_rows.py --threads 1 [--baseline main] [--lengths 256,512,1024,2048] [--rows 1,5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import torch

from specfamily.runtime import attention, kernel

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="256,512,1024,2048", help="cache lengths, comma-separated")
    parser.add_argument("--rows", default="1,5", help="fed rows, comma-separated")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=30, help="rounds (best and median kept)")
    parser.add_argument("--baseline", help="a git revision whose attention sources are timed beside this checkout's")
    parser.add_argument("--allow-new-bits", action="store_true", help="time a baseline whose bits differ")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument(
        "--shape", choices=("chain", "tree"), default="chain", help="the fed rows' visibility past one row"
    )
    args = parser.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",")]
    args.rows = [int(n) for n in args.rows.split(",")]
    return args


def baseline_module(revision: str) -> ModuleType:
    """The attention kernel's sources at ``revision`` (its folder and the shared csrc headers), built as an extension
    of its own."""
    root = Path(kernel.__file__).resolve().parents[2]
    csrc = Path(kernel.__file__).resolve().parent / "csrc"
    tag = re.sub(r"[^A-Za-z0-9]", "_", revision)
    folder = Path(tempfile.gettempdir()) / f"attention-rows-{tag}"
    listed = subprocess.run(
        [
            "git",
            "ls-tree",
            "--name-only",
            revision,
            f"{csrc.relative_to(root)}/",
            f"{csrc.relative_to(root)}/attention/",
        ],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in listed:
        if not name.endswith((".h", ".cpp")) or "/layers/" in name:
            continue
        text = subprocess.run(
            ["git", "show", f"{revision}:{name}"], cwd=root, check=True, capture_output=True, text=True
        ).stdout
        copy = folder / Path(name).relative_to(csrc.relative_to(root))
        copy.parent.mkdir(parents=True, exist_ok=True)
        if not copy.is_file() or copy.read_text(encoding="utf-8") != text:
            copy.write_text(text, encoding="utf-8")
    source = folder / "attention" / "attention.cpp"
    keyed = [source, *sorted(folder.glob("attention/*.h")), *sorted(folder.glob("*.h"))]
    return kernel.build_extension(
        f"{attention.NAME}_{tag}", [source], kernel.build_folder(source, keyed, prefix="attention_rows")
    )


def caches(args: argparse.Namespace, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, keys and values (1, kv heads, length, dim): views of buffers with room to grow, as a cache's."""
    room = length + 64
    out = []
    for _ in range(args.layers):
        k = torch.randn(1, args.kv_heads, room, args.dim)[:, :, :length]
        v = torch.randn(1, args.kv_heads, room, args.dim)[:, :, :length]
        out.append((k, v))
    return out


def chain_visible(rows: int, length: int) -> torch.Tensor | None:
    """A chain's visibility: row r sees the cache up to and including its own key (None for one row: all of it)."""
    if rows == 1:
        return None
    seen = torch.ones(rows, length, dtype=torch.bool)
    for r in range(rows):
        seen[r, length - rows + r + 1 :] = False
    return seen


def tree_visible(rows: int, length: int) -> torch.Tensor | None:
    """A tree's visibility: the root (the first fed row) and rows - 1 nodes in two branches, node i's parent node
    i - 2 (the root for nodes 0 and 1: parents ``[-1, -1, 0, 1]`` at 5 rows, pass_goals' tree); each row sees the
    cache before the fed rows, the root, its ancestors and itself (None for one row: every key)."""
    if rows == 1:
        return None
    cache = length - rows
    seen = torch.zeros(rows, length, dtype=torch.bool)
    seen[:, : cache + 1] = True
    for node in range(rows - 1):
        ancestor = node
        while ancestor >= 0:
            seen[node + 1, cache + 1 + ancestor] = True
            ancestor -= 2
    return seen


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    module = attention.build_attention()
    kernels = {"this checkout": module.attend}
    if args.baseline:
        kernels[args.baseline] = baseline_module(args.baseline).attend
    clock = CLOCKS[args.clock]
    scale = args.dim**-0.5
    cases = []
    for length in args.lengths:
        layers = caches(args, length)
        for rows in args.rows:
            q = torch.randn(1, args.heads, rows, args.dim)
            visible = (tree_visible if args.shape == "tree" else chain_visible)(rows, length)
            cases.append((length, rows, q, layers, visible))
    for length, rows, q, layers, visible in cases:
        outs = [fn(q, *layers[0], visible, scale) for fn in kernels.values()]
        if not args.allow_new_bits and not all(torch.equal(outs[0], o) for o in outs[1:]):
            raise SystemExit(f"the kernels' bits differ at length {length}, {rows} rows (--allow-new-bits times them)")
    print(f"isa {module.isa()}, {args.threads} threads, clock {args.clock}, load {os.getloadavg()[0]:.2f}")
    seconds: dict[tuple[str, int, int], list[float]] = {}
    names = list(kernels)
    for round_ in range(args.repeats):
        order = names[round_ % len(names) :] + names[: round_ % len(names)]
        for length, rows, q, layers, visible in cases:
            for name in order:
                fn = kernels[name]
                start = clock()
                for k, v in layers:
                    fn(q, k, v, visible, scale)
                seconds.setdefault((name, length, rows), []).append(clock() - start)
    print(f"load after {os.getloadavg()[0]:.2f}")
    print("| kernel | length | rows | best ms | median ms | best / 1 row |")
    print("|---|---:|---:|---:|---:|---:|")
    report = {}
    for name in names:
        for length in args.lengths:
            one = min(seconds[(name, length, min(args.rows))])
            for rows in args.rows:
                s = seconds[(name, length, rows)]
                report[(name, length, rows)] = (min(s), statistics.median(s))
                print(
                    f"| {name} | {length} | {rows} | {1e3 * min(s):.3f} | {1e3 * statistics.median(s):.3f} "
                    f"| {min(s) / one:.2f} |"
                )
    return report


if __name__ == "__main__":
    main()
