"""Batch 1 against ``sf.generate``: ``sf.generate_batch(target, drafter, [prompt], max_batch=1)`` and
``sf.generate(target, drafter, prompt)`` on the same prompts, plain decoding and each drafter, in one process.

Issue 33's goal: batch 1 no slower than ``sf.generate`` (within 2%). ``generate_batch`` hands ``max_batch=1`` (or a
single prompt) to ``generate`` itself, one request after the other, so the two paths run the same passes; this checks
that nothing around it costs. For each method (a fresh drafter per run), the first ``--prompts`` Spec-Bench first
turns (chat template, last ``--max-prompt-tokens``) are decoded greedily through both paths, request i with seed i,
the paths alternating in order round by round, ``--repeats`` rounds after a warm-up; the median seconds per path
(``--clock cpu``: this process's CPU time, steadier where other processes share the cores), the 95% t interval of
the rounds' own ratios (each round runs a method's two paths back to back) and whether every run's tokens equal
``generate``'s.

At its defaults a drafter's policy is cost-aware: it decides from the passes it times, so two runs of the same path
draft differently and their times spread by more than the 2% the goal asks about. ``--gamma N`` gives every drafter
the constant draft length N: both paths then make the same decisions (the passes counted per run are compared), and
the ratio reads the paths alone.

    python benchmarks/batch_one.py --threads 1 --matmul stream --drafters prompt_lookup,suffix,eagle,medusa,small_model
    python benchmarks/batch_one.py --threads 2 --clock wall --matmul stream --gamma 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from common import make_clock, paired_interval, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf

PATHS = ("generate", "generate_batch")


def run(target, name: str, path: str, prompts, max_new_tokens: int, clock,
        gamma: int | None = None) -> tuple[float, list[list[int]], list[int]]:
    """(seconds, tokens per request, target passes per request) of one method's requests through one path; with
    ``gamma``, the drafter at that constant draft length."""
    options = {} if gamma is None else {"gamma": gamma}
    drafter = None if name == "plain" else sf.create_drafter(name, target, **options)  # loading is not timed
    start, results = clock(), []
    for i, prompt in enumerate(prompts):
        if path == "generate":
            results.append(sf.generate(target, drafter, prompt, max_new_tokens, seed=i))
        else:
            results.append(sf.generate_batch(target, drafter, [prompt], max_new_tokens, max_batch=1, seed=i)[0])
    return clock() - start, [r.tokens for r in results], [r.metrics.target_passes for r in results]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="exact")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--drafters", default="prompt_lookup,suffix,eagle,medusa,small_model")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gamma", type=int, default=None,
                        help="every drafter at this constant draft length (default: its own, cost-aware)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    clock = make_clock(args.clock)
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, _ = spec_bench_prompts(3, target.tokenizer)
    prompts = [p[-args.max_prompt_tokens :] for p in prompts][: args.prompts]
    names = ["plain", *args.drafters.split(",")] if args.drafters else ["plain"]
    times: dict[tuple[str, str], list] = defaultdict(list)
    for round_ in range(args.repeats + 1):  # round 0: warm-up (the cost-aware policy's calibration), not kept
        for name in names:
            for path in PATHS if round_ % 2 else PATHS[::-1]:
                result = run(target, name, path, prompts, args.max_new_tokens, clock, args.gamma)
                if round_:
                    times[(name, path)].append(result)
    print(
        f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, {args.threads} thread(s), {args.clock} clock, "
        f"matmul {args.matmul}, median of {args.repeats}, "
        + ("each drafter's own policy" if args.gamma is None else f"constant gamma {args.gamma}")
    )
    print("| method | generate s | generate_batch(max_batch=1) s | batch / generate | 95% interval | tokens equal "
          "| passes equal |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        one, batch = (statistics.median(r[0] for r in times[(name, p)]) for p in PATHS)
        ratios = [b[0] / g[0] for g, b in zip(times[(name, "generate")], times[(name, "generate_batch")], strict=True)]
        interval = paired_interval(ratios)  # each round's two paths back to back: its own ratio
        span = "" if interval is None else f"{interval[0]:.3f}-{interval[1]:.3f}"
        reference = times[(name, "generate")][0]
        same = all(r[1] == reference[1] for p in PATHS for r in times[(name, p)])
        passes = all(r[2] == reference[2] for p in PATHS for r in times[(name, p)])
        print(f"| {name} | {one:.3f} | {batch:.3f} | {batch / one:.3f} | {span} | {same} | {passes} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
