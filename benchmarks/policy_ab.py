"""Interleaved A/B of two auto policies at batch 1 on the CPU clock: plain decoding, a baseline ``policy.py``'s
``AutoPolicy`` and this tree's, round after round in one process (a fresh drafter per arm, greedy text checked).

The first round's first drafter arm includes a warm-up: read rounds 2 on.

    git show main:specfamily/core/policy.py > /tmp/policy_main.py
    python benchmarks/policy_ab.py --drafter small_model --baseline /tmp/policy_main.py --rounds 5
    python benchmarks/policy_ab.py --drafter small_model --baseline /tmp/policy_main.py --start-gamma 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from policy_replay import load_policy, requests

import specfamily as sf
from specfamily.core.policy import AutoPolicy


def run_arm(target, prompts, plain, drafter) -> tuple[float, int]:
    """CPU seconds and passes for the requests, text checked against plain decoding."""
    passes, start = 0, time.process_time()
    for i, prompt in enumerate(prompts):
        result = sf.generate(target, drafter, prompt, len(plain[i]), seed=i)
        if result.tokens != plain[i]:
            raise AssertionError(f"request {i} differs from plain decoding")
        passes += len(result.trace.accepted) if drafter else len(result.tokens)
    return time.process_time() - start, passes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafter", default="small_model")
    parser.add_argument("--baseline", required=True, help="another policy.py whose AutoPolicy is arm 'baseline'")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--start-gamma", type=int, default=0, help="this arm's start gamma; 0: the drafter's")
    args = parser.parse_args(argv)
    target, prompts, plain = requests(args)
    arms = {"baseline": load_policy(args.baseline), "this": AutoPolicy}
    times: dict[str, list[float]] = {"plain": [], "baseline": [], "this": []}
    for round_ in range(args.rounds):
        times["plain"].append(run_arm(target, prompts, plain, None)[0])
        for label, cls in arms.items():
            drafter = sf.create_drafter(args.drafter, target)
            gamma = args.start_gamma if label == "this" and args.start_gamma else drafter.policy.gamma
            drafter.policy = cls(gamma, max_gamma=drafter.policy.max_gamma)
            seconds, passes = run_arm(target, prompts, plain, drafter)
            times[label].append(seconds)
            if round_ == args.rounds - 1:
                print(f"{label}: {passes} passes; {drafter.policy.describe()}", flush=True)
    for label in arms:
        speedups = [p / s for p, s in zip(times["plain"], times[label], strict=True)]
        print(
            f"{args.drafter} {label}: median speedup {statistics.median(speedups[1:] or speedups):.3f} "
            f"(rounds 2 on), each {[round(x, 3) for x in speedups]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
