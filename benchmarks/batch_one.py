"""Batch 1 against ``sf.generate``: ``sf.generate_batch(target, drafter, [prompt], max_batch=1)`` and
``sf.generate(target, drafter, prompt)`` on the same prompts, plain decoding and each drafter, in one process.

Issue 33's goal: batch 1 no slower than ``sf.generate`` (within 2%). ``generate_batch`` hands ``max_batch=1`` (or a
single prompt) to ``generate`` itself, one request after the other, so the two paths run the same passes; this checks
that nothing around it costs. For each method (a fresh drafter per run), the first ``--prompts`` Spec-Bench first
turns (chat template, last ``--max-prompt-tokens``) are decoded greedily through both paths, request i with seed i,
the paths alternating in order round by round, ``--repeats`` rounds after a warm-up; the median seconds per path
(``--clock cpu``: this process's CPU time, steadier where other processes share the cores) and whether every run's
tokens equal ``generate``'s.

    python benchmarks/batch_one.py --threads 1 --matmul stream --drafters prompt_lookup,suffix,eagle,medusa,small_model
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf

PATHS = ("generate", "generate_batch")


def run(target, name: str, path: str, prompts, max_new_tokens: int, clock) -> tuple[float, list[list[int]]]:
    """(seconds, tokens per request) of one method's requests through one path."""
    drafter = None if name == "plain" else sf.create_drafter(name, target)  # loading is not timed
    start, tokens = clock(), []
    for i, prompt in enumerate(prompts):
        if path == "generate":
            tokens.append(sf.generate(target, drafter, prompt, max_new_tokens, seed=i).tokens)
        else:
            tokens.append(sf.generate_batch(target, drafter, [prompt], max_new_tokens, max_batch=1, seed=i)[0].tokens)
    return clock() - start, tokens


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
                result = run(target, name, path, prompts, args.max_new_tokens, clock)
                if round_:
                    times[(name, path)].append(result)
    print(
        f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, {args.threads} thread(s), {args.clock} clock, "
        f"matmul {args.matmul}, median of {args.repeats}"
    )
    print("| method | generate s | generate_batch(max_batch=1) s | batch / generate | tokens equal |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        one, batch = (statistics.median(r[0] for r in times[(name, p)]) for p in PATHS)
        reference = times[(name, "generate")][0][1]
        same = all(r[1] == reference for p in PATHS for r in times[(name, p)])
        print(f"| {name} | {one:.3f} | {batch:.3f} | {batch / one:.3f} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
