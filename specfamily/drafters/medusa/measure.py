"""Measure Medusa against plain decoding on held-out prompts: tau and speedup, default tree and top-1 chain.

``python -m specfamily.drafters.medusa.measure --target zoo:code-target --weights zoo:code-medusa``.
Greedy decoding; every Medusa output is checked token for token against plain decoding. Time is the process's
CPU time when running single-threaded on CPU (immune to busy neighbours), wall time otherwise.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from specfamily.core.costs import process_clock


@dataclass
class Row:
    mode: str
    nodes: int
    tau: float
    seconds: float
    speedup: float
    identical: bool


def load_prompts(target, name: str, count: int, max_tokens: int) -> list[list[int]]:
    """``count`` prompts of a shipped zoo prompt set, tokenised, each cut to its last ``max_tokens`` tokens."""
    from specfamily.zoo.prompts import load_prompt_set

    data = load_prompt_set(name)
    step = max(1, len(data) // count)
    rows = [data[i] for i in range(0, len(data), step)][:count]
    if "prompt_ids" in data.column_names:
        ids = [list(r["prompt_ids"]) for r in rows]
    else:
        ids = [target.tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
    return [p[-max_tokens:] for p in ids]


def run(target, drafter, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], float, float]:
    """(outputs, tau over all prompts, seconds)."""
    from specfamily.core.loop import generate

    clock = process_clock(target.device)
    outputs, tokens, passes, seconds = [], 0, 0, 0.0
    for prompt in prompts:
        started = clock()
        result = generate(target, drafter, prompt, max_new_tokens=max_new_tokens)
        seconds += clock() - started
        outputs.append(result.tokens)
        tokens, passes = tokens + result.metrics.new_tokens, passes + result.metrics.target_passes
    return outputs, tokens / max(passes, 1), seconds


def measure(target, weights: str, prompts: list[list[int]], max_new_tokens: int) -> list[Row]:
    from specfamily.drafters.medusa.drafter import MedusaDrafter

    run(target, None, prompts[:1], 8)  # warm-up
    plain, _, base = run(target, None, prompts, max_new_tokens)
    rows = [Row("plain", 0, 1.0, base, 1.0, True)]
    for mode in ("default", "chain"):
        drafter = MedusaDrafter(target, weights=weights, tree=None if mode == "default" else "chain")
        outputs, tau, seconds = run(target, drafter, prompts, max_new_tokens)
        rows.append(Row(f"medusa {mode}", drafter.tree.size, tau, seconds, base / seconds, outputs == plain))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specfamily.drafters.medusa.measure", description=__doc__)
    parser.add_argument("--target", default="zoo:code-target")
    parser.add_argument("--weights", default="zoo:code-medusa")
    parser.add_argument("--prompts", default="complete", help="zoo prompt set: complete or continue")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specfamily.core.target import load_target

    target = load_target(args.target, dtype=torch.float32)
    prompts = load_prompts(target, args.prompts, args.count, args.prompt_tokens)
    rows = measure(target, args.weights, prompts, args.max_new_tokens)
    print("| mode | tree nodes | tau | seconds | speedup | identical to plain |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.mode} | {r.nodes} | {r.tau:.3f} | {r.seconds:.2f} | {r.speedup:.2f} | {r.identical} |")


if __name__ == "__main__":
    main()
