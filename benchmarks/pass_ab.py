"""Whole passes of this checkout against another, each in its own processes, alternated (issue 32).

A change to where memory lives (huge pages, an arena's layout) cannot be A/B'd inside one process: the two arms
would share the packed weights and caches. This script times whole passes (forward, greedy verification, commit,
rollback; ``plain`` = the root alone, ``chain`` and ``tree`` = root + ``--nodes`` tokens as ``pass_rest.py`` feeds them)
at each cache length, median of ``--passes`` per arm, wall clock, ``--threads`` threads. With ``--other DIR`` (the
root of another checkout, e.g. ``git worktree add /tmp/base <rev>``, its C++ extensions built there on first use) it
runs itself ``--rounds`` times per side in fresh processes, sides alternated, and prints each round's medians and the
difference of the two sides' medians of rounds. Run it on an otherwise idle machine: a busy core, or a noisy
neighbour on the host, moves whole passes by milliseconds.

    python benchmarks/pass_ab.py --threads 2 --lengths 200,700 --passes 40
    python benchmarks/pass_ab.py --threads 2 --other /tmp/base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default="200,700", help="cache lengths, comma-separated")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--passes", type=int, default=40, help="timed passes per arm and length (after 3 warm-up)")
    parser.add_argument("--other", default=None, help="the root of another checkout to alternate with")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side (with --other)")
    parser.add_argument("--json", default=None, help="one side's medians (what a round's subprocess writes)")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """length -> arm -> median wall ms of a whole pass."""
    import torch
    from common import set_threads
    from pass_cost import Shapes
    from pass_rest import arms

    from specfamily.core.acceptance import verify_draft
    from specfamily.core.target import load_target
    from specfamily.core.types import SamplingConfig

    set_threads(args.threads)
    target = load_target(args.model, matmul="stream")
    greedy, out = SamplingConfig(temperature=0.0), {}
    with torch.inference_mode():
        for length in (int(x) for x in args.lengths.split(",")):
            fed = arms(target, length, Shapes(args.nodes))
            times: dict[str, list[float]] = {kind: [] for kind in fed}
            for round_ in range(args.passes + 3):
                for kind, (root, draft, path) in fed.items():
                    before, start = target.cached_length, time.perf_counter()
                    logits = target.forward(root, draft).logits
                    verify_draft(draft, logits, greedy, torch.Generator().manual_seed(0))
                    target.commit(path)
                    seconds = time.perf_counter() - start
                    target.rollback(before)
                    if round_ >= 3:
                        times[kind].append(seconds * 1e3)
            out[str(length)] = {kind: statistics.median(v) for kind, v in times.items()}
    return out


def side(root: Path, args: argparse.Namespace, json_path: Path) -> dict[str, dict[str, float]]:
    """One round of one side: this script, as the checkout at ``root`` has it, in a fresh process."""
    script = root / "benchmarks" / "pass_ab.py"
    script = script if script.is_file() else HERE / "pass_ab.py"  # a checkout from before this script
    path = os.pathsep.join([str(root), str(root / "benchmarks"), str(HERE)])  # that checkout's package first
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(script), "--model", args.model, "--threads", str(args.threads), "--lengths",
               args.lengths, "--nodes", str(args.nodes), "--passes", str(args.passes), "--json", str(json_path)]
    subprocess.run(command, env=env, cwd=root, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(json_path.read_text(encoding="utf-8"))


def alternate(args: argparse.Namespace) -> dict:
    """Both sides, ``--rounds`` processes each, alternated; the rounds' medians and the sides' difference."""
    import tempfile

    roots = {"this": HERE.parent, "other": Path(args.other).resolve()}
    rounds: dict[str, list[dict]] = {name: [] for name in roots}
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.rounds):
            for name, root in roots.items():
                rounds[name].append(side(root, args, Path(folder) / f"{name}-{index}.json"))
                print(f"round {index + 1} {name}: " + "; ".join(
                    f"L {length}: " + ", ".join(f"{kind} {ms:.2f}" for kind, ms in arms_.items())
                    for length, arms_ in rounds[name][-1].items()), flush=True)
    print("\n| L | arm | this (median of rounds) | other | this - other |\n| ---: | --- | ---: | ---: | ---: |")
    for length, arms_ in rounds["this"][0].items():
        for kind in arms_:
            mine = statistics.median(r[length][kind] for r in rounds["this"])
            theirs = statistics.median(r[length][kind] for r in rounds["other"])
            print(f"| {length} | {kind} | {mine:.2f} | {theirs:.2f} | {mine - theirs:+.2f} |")
    return rounds


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.other:
        return alternate(args)
    result = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result), encoding="utf-8")
    else:
        for length, arms_ in result.items():
            print(f"L {length}: " + ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in arms_.items()))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
