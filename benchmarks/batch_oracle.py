"""The most a drafter's own proposals allow at a batch size: each draft cut, before it is fed, to the part the target
will accept (an oracle that knows every request's greedy text), against plain batched decoding and the drafter at
its defaults, in one process.

Issue 33's goal "suffix and prompt lookup at B = 4 >= 1.15x plain batched decoding" asks whether the proposals are
worth their rows at that load. Fed only its accepted part, a draft wastes no row: no length policy can do better with
these proposals than the best of the oracle's constant lengths (``--gammas``), up to the rows an accepted token costs
more than it saves. If that best is under the goal on this machine, the goal is out of reach here whatever the policy.

The oracle drafter is the drafter itself with its draft cut at the first token that differs from the request's text
(taken from plain decoding's run at the same B: greedy, so every lossless drafter's text equals it, which is checked
on every run); its constant length is ``create_drafter(name, target, gamma=g)``'s (the batch's length policy leaves a
constant policy alone). Methods interleaved within each round, each round starting one method later, ``--warmup``
untimed rounds, then ``--repeats`` timed ones; the median tokens/s over plain's, with each round's own ratio's 95% t
interval.

    python benchmarks/batch_oracle.py --threads 2 --clock wall --matmul stream --batch 4 --drafters prompt_lookup,suffix
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
from common import paired_interval, workload

import specfamily as sf
from specfamily.core.types import Draft


def accepted_part(draft: Draft, continuation: list[int]) -> Draft:
    """The chain of ``draft``'s nodes (a chain or a tree, deterministic) that match ``continuation`` from the root:
    the draft the target accepts in full at temperature 0."""
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    chain: list[int] = []
    last = -1  # the node the chain ends at (-1: the root)
    while len(chain) < len(continuation):
        nxt = next((i for i, (t, p) in enumerate(zip(tokens, parents, strict=True))
                    if p == last and t == continuation[len(chain)]), None)
        if nxt is None:
            break
        chain.append(tokens[nxt])
        last = nxt
    return Draft.chain(torch.tensor(chain, dtype=torch.long))


def oracle(drafter, texts: dict[tuple[int, ...], list[int]]):
    """``drafter`` with every proposal cut to its accepted part; ``texts``: each request's prompt (a tuple) -> its
    prompt + greedy tokens."""
    base = type(drafter)

    class Oracle(base):  # a subclass, so that batch slots' copies (deep copies) keep the cut
        def propose(self, ctx, gamma):
            draft = base.propose(self, ctx, gamma)
            if draft.q is not None:
                raise ValueError(f"{base.__name__}: the oracle cuts deterministic drafts only")
            text = self.oracle_texts[tuple(ctx.prompt_ids.tolist())]  # one dict lookup: the cut costs next to nothing
            return accepted_part(draft, text[len(ctx.tokens):])

    Oracle.__name__ = f"Oracle{base.__name__}"
    drafter.__class__ = Oracle
    drafter.oracle_texts = texts
    return drafter


def methods_of(names: list[str], gammas: list[int]) -> list[tuple[str, str, int | None, bool]]:
    """(label, drafter name, constant gamma or None, oracle) for every arm, plain first."""
    arms = [("plain", "", None, False)]
    for name in names:
        arms.append((name, name, None, False))
        arms += [(f"{name} oracle g={g}", name, g, True) for g in gammas]
    return arms


def run(target, arm, prompts, texts, args, clock) -> tuple[float, list[list[int]], int]:
    """(seconds, tokens per request, target passes) of one arm's call."""
    _, name, gamma, cut = arm
    drafter = None
    if name:
        drafter = sf.create_drafter(name, target) if gamma is None else sf.create_drafter(name, target, gamma=gamma)
        if cut:
            drafter = oracle(drafter, texts)
    start = clock()
    results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens, max_batch=args.batch)
    seconds = clock() - start
    return seconds, [r.tokens for r in results], sum(r.metrics.target_passes for r in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="wall")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--drafters", default="prompt_lookup,suffix")
    parser.add_argument("--gammas", default="1,2,4")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32, help="keep each prompt's last N tokens; 0: whole")
    parser.add_argument("--per-category", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args(argv)
    clock, target, prompts = workload(args)
    prompts = prompts[: args.batch * args.requests_per_slot]
    plain = sf.generate_batch(target, None, prompts, args.max_new_tokens, max_batch=args.batch)
    texts = {tuple(map(int, p)): list(map(int, p)) + r.tokens for p, r in zip(prompts, plain, strict=True)}
    expected = [r.tokens for r in plain]
    arms = methods_of([n for n in args.drafters.split(",") if n], [int(g) for g in args.gammas.split(",")])
    times: dict[str, list[tuple[float, int]]] = {label: [] for label, *_ in arms}
    for round_ in range(args.warmup + args.repeats):
        shift = round_ % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            seconds, tokens, passes = run(target, arm, prompts, texts, args, clock)
            if tokens != expected:
                raise RuntimeError(f"{arm[0]}: its text differs from plain decoding's")
            if round_ >= args.warmup:
                times[arm[0]].append((seconds, passes))
    tokens = sum(map(len, expected))
    base = times["plain"]
    cut = f"their last {args.max_prompt_tokens} tokens" if args.max_prompt_tokens > 0 else "whole"
    print(f"B={args.batch}, {len(prompts)} requests, {args.max_new_tokens} new tokens, prompts {cut}, "
          f"{args.threads} thread(s), {args.clock} clock, matmul {args.matmul}, median of {args.repeats} rounds")
    print("| method | tok/s | over plain | 95% interval | target passes |")
    print("| --- | --- | --- | --- | --- |")
    plain_s = statistics.median(s for s, _ in base)
    for label, rows in times.items():
        seconds = statistics.median(s for s, _ in rows)
        ratios = [p / s for (s, _), (p, _) in zip(rows, base, strict=True)]
        interval = None if label == "plain" else paired_interval(ratios)
        span = "" if interval is None else f"{interval[0]:.3f}-{interval[1]:.3f}"
        print(f"| {label} | {tokens / seconds:.1f} | {plain_s / seconds:.3f} | {span} | {rows[-1][1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
