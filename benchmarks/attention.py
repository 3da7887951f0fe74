"""The batch-invariant attention kernel against sdpa, in whole target passes: per-pass ms, plain / chain / tree.

Two targets on one model (the C++ layer loop in both): ``Target(native_attention=False)`` (sdpa, today's default)
and ``native_attention=True`` (``specfamily.runtime.attention``). For each cache length (``--lengths``) it times
``forward`` + ``commit`` of a decode pass (``plain``), a chain of ``--nodes`` draft tokens and a two-branch tree of as
many (the shapes of ``benchmarks/pass_cost.py``), arms and kinds interleaved pass by pass (the order rotating each
round), each pass on ``time.process_time`` at a fixed thread count, and prints medians, on / off, and each arm's
drafted / plain ratio. Before timing it checks the property the kernel exists for: a chain's fed rows equal, bit for
bit, the plain passes that would have fed those tokens (and says how far the kernel's logits are from sdpa's).

    python benchmarks/attention.py --threads 1 [--lengths 128,384,768] [--repeats 21] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
from pass_cost import KINDS, Shapes, one_pass, prefill

from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft

ARMS = ("sdpa", "kernel")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="128,384,768", help="cache lengths, comma-separated")
    parser.add_argument("--nodes", type=int, default=4, help="draft tokens fed with the root")
    parser.add_argument("--repeats", type=int, default=21, help="timed passes per arm, kind and length (median)")
    parser.add_argument("--rounds", type=int, default=2, help="repeat the whole table this many times (noise)")
    return parser.parse_args(argv)


@torch.inference_mode()
def check(target: Target, sdpa: Target, length: int, nodes: int) -> tuple[bool, float]:
    """(a chain's fed rows == the plain passes feeding the same tokens, bit for bit; max |kernel - sdpa| logit)."""
    tokens = torch.arange(1, nodes + 2) * 7 % target.vocab_size
    prefill(target, length)
    fed = target.forward(tokens[:1], Draft.chain(tokens[1:])).logits
    target.commit([])
    prefill(target, length)
    plain = []
    for token in tokens:
        plain.append(target.forward(token[None]).logits[0])
        target.commit([])
    prefill(sdpa, length)
    theirs = sdpa.forward(tokens[:1], Draft.chain(tokens[1:])).logits
    sdpa.commit([])
    same = all(torch.equal(fed[i], plain[i]) for i in range(nodes + 1))
    return same, float((fed - theirs).abs().max())


def time_length(targets: dict[str, Target], shapes: Shapes, length: int, repeats: int) -> dict[tuple[str, str], float]:
    """(arm, kind) -> median CPU seconds of one pass at ``length``, arms and kinds interleaved (after a warm-up)."""
    for target in targets.values():
        prefill(target, length)
    runs = [(arm, kind) for arm in ARMS for kind in KINDS]
    generator = torch.Generator().manual_seed(length)
    times: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    for round_ in range(repeats + 1):
        tokens = torch.randint(0, targets[ARMS[0]].vocab_size, (shapes.nodes + 1,), generator=generator)
        shift = round_ % len(runs)
        for arm, kind in runs[shift:] + runs[:shift]:
            elapsed = one_pass(targets[arm], shapes, kind, length, tokens)
            if round_:
                times[arm, kind].append(elapsed)
    return {run: statistics.median(values) for run, values in times.items()}


def table(results: dict[int, dict[tuple[str, str], float]]) -> str:
    lines = ["| cache L | " + " | ".join(f"{k} sdpa ms | {k} kernel ms | {k} kernel / sdpa" for k in KINDS)
             + " | chain / plain sdpa | chain / plain kernel | tree / plain sdpa | tree / plain kernel |",
             "|---:" * (1 + 3 * len(KINDS) + 4) + "|"]
    for length, t in results.items():
        cells = [f"{t['sdpa', k] * 1e3:.2f} | {t['kernel', k] * 1e3:.2f} | {t['kernel', k] / t['sdpa', k]:.3f}"
                 for k in KINDS]
        ratios = [t[arm, k] / t[arm, "plain"] for k in ("chain", "tree") for arm in ARMS]
        lines.append(f"| {length} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[int, dict[tuple[str, str], float]]:
    """Prints the check and one table per round; returns the last round's medians (length -> (arm, kind) -> s)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_target(args.model, device="cpu", matmul="stream")
    targets = {arm: Target(loaded.model, loaded.tokenizer, matmul="stream", native_attention=arm == "kernel")
               for arm in ARMS}
    if targets["kernel"].lean is None or targets["kernel"].lean.attention is None:
        raise SystemExit("the attention kernel is not available here (see the warning above)")
    lengths = [int(x) for x in args.lengths.split(",")]
    shapes = Shapes(args.nodes)
    for length in lengths:
        same, diff = check(targets["kernel"], targets["sdpa"], length, args.nodes)
        print(f"L {length}: chain rows {'==' if same else 'DIFFER from'} plain passes (kernel), bit for bit; "
              f"max |logit kernel - sdpa| {diff:.3g}")
    print(f"{args.model}, {args.threads} thread(s), CPU time, median of {args.repeats} interleaved passes, "
          f"{args.nodes} draft nodes, native layer loop {'on' if targets['kernel'].lean.native else 'off'}")
    for round_ in range(args.rounds):
        started = time.perf_counter()
        results = {length: time_length(targets, shapes, length, args.repeats) for length in lengths}
        print(f"\nround {round_ + 1} ({time.perf_counter() - started:.0f} s wall)")
        print(table(results))
    return results


if __name__ == "__main__":
    main()
