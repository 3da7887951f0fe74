"""What recording the passes costs: ``sf.generate(trace=True)`` against ``trace=False`` and against no recorder.

For each arm (plain decoding and a few drafters), the same prompts are generated three ways: with the trace (the
default), with ``trace=False`` (latency and memory metrics only), and with the loop's recorder replaced by one that
records nothing (the loop as it was before traces), rotating the order every round, timed with the process's CPU
time on one thread (immune to busy neighbours). The script prints each arm's median seconds per request, the
per-round ratios' median and range against no recorder, and checks that every way produces the same tokens.

    python benchmarks/trace_overhead.py --threads 1 [--target zoo:code-target] [--rounds 7] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import specfamily as sf
from specfamily.core import loop

PROMPTS = ("def fibonacci(n):\n    ", "import os\n\n\ndef list_files(path):\n",
           "class Stack:\n    def __init__(self):\n")


class _NoRecorder:
    """The loop's recorder doing nothing: the loop without traces, latency or memory metrics."""

    @classmethod
    def start(cls, *args, **kwargs) -> _NoRecorder:
        return cls()

    def record(self, *args) -> None:
        pass

    def finish(self, metrics):
        return metrics, None


MODES = ("trace", "no trace", "none")


def _timed(target, drafter, prompts: list[list[int]], tokens: int, mode: str) -> tuple[float, list[list[int]]]:
    recorder = loop.TraceRecorder
    if mode == "none":
        loop.TraceRecorder = _NoRecorder
    try:
        start = time.process_time()
        outputs = [sf.generate(target, drafter, ids, tokens, trace=mode == "trace").tokens for ids in prompts]
        return time.process_time() - start, outputs
    finally:
        loop.TraceRecorder = recorder


def measure(target, name: str | None, prompts: list[list[int]], tokens: int, rounds: int) -> dict[str, list[float]]:
    """CPU seconds per request of each mode, per round."""
    drafter = None if name is None else sf.create_drafter(name, target)
    _timed(target, drafter, prompts, tokens, "trace")  # warm-up
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        outputs = {}
        for mode in MODES[r % 3:] + MODES[: r % 3]:
            spent, outputs[mode] = _timed(target, drafter, prompts, tokens, mode)
            seconds[mode].append(spent / len(prompts))
        if len({str(o) for o in outputs.values()}) != 1:
            raise AssertionError(f"{name}: recording changed the tokens")
    return seconds


def _ratio(seconds: dict[str, list[float]], mode: str) -> str:
    ratios = [a / b for a, b in zip(seconds[mode], seconds["none"], strict=True)]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:code-target")
    parser.add_argument("--drafters", default="plain,prompt_lookup,small_model,eagle")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = sf.load_target(args.target)
    prompts = [target.tokenizer.encode(p) for p in PROMPTS]
    print(f"target {args.target}, {args.threads} thread(s), {len(prompts)} prompts x {args.tokens} tokens, "
          f"{args.rounds} rounds (CPU seconds per request, median)")
    print(f"{'arm':<14} {'trace':>8} {'no trace':>9} {'none':>8}   trace/none (range)      no trace/none (range)")
    for arm in args.drafters.split(","):
        seconds = measure(target, None if arm == "plain" else arm, prompts, args.tokens, args.rounds)
        medians = [statistics.median(seconds[mode]) for mode in MODES]
        print(f"{arm:<14} {medians[0]:>8.4f} {medians[1]:>9.4f} {medians[2]:>8.4f}   {_ratio(seconds, 'trace'):<23} "
              f"{_ratio(seconds, 'no trace')}", flush=True)


if __name__ == "__main__":
    main()
