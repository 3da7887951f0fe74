"""Training-free variants beside each other: recycling, lookahead, rest, prompt lookup and suffix against plain
decoding, greedy, Spec-Bench first turns by category, one run, prompts interleaved across arms.

Every arm runs at its defaults (the cost-aware policy) and serves every prompt in turn with one drafter object (so
recycling's table and suffix's global cache grow across prompts, as in a server); its tokens are checked against
plain decoding's. Time is ``time.process_time`` around each generation on one thread (CPU time: a busy neighbour
on the other core slows it much less than wall time). Printed: tau and speedup (plain CPU time / the arm's) per
category and overall, as Markdown::

    python benchmarks/variants.py --threads 2 --per-category 1 --max-new-tokens 64 --out variants.json
    python benchmarks/variants.py --arms recycling,rest --rest-datastore ~/.cache/specfamily/rest/smollm2

An arm may carry options as JSON after a colon: ``--arms 'recycling,recycling:{"template": "2.2.2"}'``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from suffix import spec_bench_items

import specfamily as sf

PLAIN = "plain"


@dataclass
class Totals:
    tokens: int = 0
    passes: int = 0
    seconds: float = 0.0
    mismatches: int = 0

    def add(self, tokens: int, passes: int, seconds: float, mismatch: bool) -> None:
        self.tokens += tokens
        self.passes += passes
        self.seconds += seconds
        self.mismatches += mismatch


def make_arms(target, names: Sequence[str], rest_datastore: str | None) -> dict[str, object]:
    arms: dict[str, object] = {PLAIN: None}
    for arm in names:
        name, _, given = arm.partition(":")
        options = {"datastore": rest_datastore} if name == "rest" and rest_datastore else {}
        arms[arm] = sf.create_drafter(name, target, **options, **(json.loads(given) if given else {}))
    return arms


def split_arms(text: str) -> list[str]:
    """``name[:{json}]`` arms separated by commas outside the JSON."""
    arms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            arms.append(text[start:i])
            start = i + 1
    return [*arms, text[start:]] if text[start:] else arms


def run(target, arms: dict[str, object], items, max_new_tokens: int,
        out: str | None = None) -> dict[str, dict[str, Totals]]:
    """Every item with every arm in turn (plain first: the reference); totals per arm and category ("all" too),
    written to ``out`` (JSON) after each prompt, so an interrupted run keeps what it measured."""
    totals: dict[str, dict[str, Totals]] = {name: {} for name in arms}
    for i, item in enumerate(items):
        reference = None
        for name, drafter in arms.items():
            start = time.process_time()
            result = sf.generate(target, drafter, item.ids, max_new_tokens=max_new_tokens)
            seconds = time.process_time() - start
            reference = result.tokens if reference is None else reference
            for key in ("all", item.category):
                totals[name].setdefault(key, Totals()).add(len(result.tokens), result.metrics.target_passes,
                                                           seconds, result.tokens != reference)
        print(f"prompt {i + 1}/{len(items)} ({item.category}) done", flush=True)
        if out:
            save(out, totals, prompts=i + 1)
    return totals


def save(out: str, totals: dict[str, dict[str, Totals]], **extra) -> None:
    data = {arm: {c: vars(t) for c, t in by.items()} for arm, by in totals.items()}
    with open(out, "w") as f:
        json.dump({**extra, "totals": data, "markdown": markdown(totals)}, f, indent=1)


def warm_up(target, arms: dict[str, object]) -> None:
    """Untimed: the target's verify-cost curve (measured once per target, by the first cost-aware arm otherwise) and
    one short generation per arm on a prompt that is not an evaluation prompt (the zoo's first instruct prompt)."""
    from specfamily.core.costs import target_cost_curve
    from specfamily.zoo.prompts import prompt_ids

    [ids] = prompt_ids("instruct", 1, target.tokenizer)
    target_cost_curve(target, ids)
    for drafter in arms.values():
        sf.generate(target, drafter, ids, max_new_tokens=16)


def markdown(totals: dict[str, dict[str, Totals]]) -> str:
    plain = totals[PLAIN]
    arms = [name for name in totals if name != PLAIN]
    lines = ["| category | " + " | ".join(f"{a} tau | {a} speedup" for a in arms) + " |",
             "| --- |" + " ---: | ---: |" * len(arms)]
    for category in plain:
        cells = []
        for arm in arms:
            t = totals[arm][category]
            flag = "" if t.mismatches == 0 else " (NOT identical)"
            cells.append(f"{t.tokens / t.passes:.2f} | {plain[category].seconds / t.seconds:.2f}{flag}")
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--arms", default="recycling,lookahead,rest,prompt_lookup,suffix")
    parser.add_argument("--rest-datastore", default=None)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="stream", help="the lean forward's matmul kind (the default run's pick)")
    parser.add_argument("--out", default=None, help="write the totals as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = sf.load_target(args.target, matmul=args.matmul)
    items = spec_bench_items(target.tokenizer, args.per_category)
    arms = make_arms(target, split_arms(args.arms), args.rest_datastore)
    warm_up(target, arms)
    totals = run(target, arms, items, args.max_new_tokens, args.out)
    print(markdown(totals))
    return {arm: {c: vars(t) for c, t in by.items()} for arm, by in totals.items()}


if __name__ == "__main__":
    main()
