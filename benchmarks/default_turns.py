"""Drafters at their defaults on the default run's Spec-Bench set (one question per category, second turns asked after
the model's own first answer: 21 turns), beside plain decoding, measured in one process.

Each arm is one drafter object serving every turn in turn (as a run does: suffix's cache and every cost-aware
policy learn across requests), after one untimed 16-token generation by another object of the same configuration
on the zoo's first instruct prompt (as the runner warms up). Turns are interleaved across arms in a rotated order,
``--repeats`` times (a fresh drafter object per arm and repeat). Greedy: every arm's text is checked against plain
decoding's, token for token. Time is CPU time (``time.process_time``) at one thread (immune to busy neighbours),
wall time (``perf_counter``) with more. tau is a count: load-free. ``--breakdown`` adds, per arm, where a pass's
time goes (``pass_breakdown``: propose, the target's pass, observe, policy; the merge's parts apart).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/default_turns.py --threads 1 --repeats 2 --breakdown \\
        '{"name": "suffix"}' '{"name": "merge"}' '{"name": "eagle3"}' --out docs/merge-turns.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

import specfamily as sf

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Turn:
    category: str
    turn: int  # 1 or 2
    ids: list[int]


@dataclass
class ArmTotals:
    """One arm's totals over the turns of one repeat."""

    tokens: int = 0
    passes: int = 0
    seconds: float = 0.0
    by_category: dict = field(default_factory=dict)  # category -> [tokens, passes, seconds]
    note: str = ""  # the policy's own account after the last turn


def default_turns(target, per_category: int, max_new_tokens: int) -> tuple[list[Turn], list[list[int]]]:
    """The default run's turns (first turns, then each second turn after plain decoding's own first answer, right
    after its first turn) and plain decoding's greedy tokens of each."""
    from specfamily.eval.datasets import DatasetSpec, load_prompts, turn_prompt_ids
    from specfamily.io.chat import answer_text

    spec = DatasetSpec(name="spec_bench", path="specfamily:spec_bench", field=None, id_field="question_id",
                       chat_template=True, add_special_tokens=False, num_examples=per_category,
                       select="per_category", turns_field="turns", max_turns=None, category_field="category")
    turns, plain = [], []
    for prompt in load_prompts(spec, target.tokenizer):
        first = sf.generate(target, None, prompt.ids, max_new_tokens=max_new_tokens).tokens
        turns.append(Turn(str(prompt.category), 1, prompt.ids))
        plain.append(first)
        if prompt.n_turns > 1:
            ids = turn_prompt_ids(spec, prompt, [answer_text(target.tokenizer, first)], target.tokenizer)
            turns.append(Turn(str(prompt.category), 2, ids))
            plain.append(sf.generate(target, None, ids, max_new_tokens=max_new_tokens).tokens)
    return turns, plain


def make_arm(target, spec: dict | None, warm: list[int]):
    """A drafter (None: plain) after a warm-up generation by another object of the same configuration."""
    if spec is None:
        sf.generate(target, None, warm, max_new_tokens=16)
        return None
    options = dict(spec)
    name = options.pop("name")
    sf.generate(target, sf.create_drafter(name, target, **options), warm, max_new_tokens=16)
    return sf.create_drafter(name, target, **options)


def run_repeat(target, arms: dict, turns: list[Turn], plain: list[list[int]], max_new_tokens: int, clock,
               repeat: int, breakdowns: dict) -> dict[str, ArmTotals]:
    totals = {label: ArmTotals() for label in arms}
    labels = list(arms)
    for i, (turn, reference) in enumerate(zip(turns, plain, strict=True)):
        shift = (i + repeat) % len(labels)
        for label in labels[shift:] + labels[:shift]:
            drafter = arms[label]
            log = breakdowns.get(label)
            if log is not None:
                log.begin_request()
            start = clock()
            result = sf.generate(target, drafter, turn.ids, max_new_tokens=max_new_tokens)
            seconds = clock() - start
            if log is not None:
                log.end_request(seconds)
            if result.tokens != reference:
                raise AssertionError(f"{label}: {turn.category} turn {turn.turn} differs from plain decoding")
            add(totals[label], turn.category, len(result.tokens), result.metrics.target_passes, seconds)
            totals[label].note = result.metrics.policy_note
    return totals


def add(totals: ArmTotals, category: str, tokens: int, passes: int, seconds: float) -> None:
    totals.tokens += tokens
    totals.passes += passes
    totals.seconds += seconds
    row = totals.by_category.setdefault(category, [0, 0, 0.0])
    row[0], row[1], row[2] = row[0] + tokens, row[1] + passes, row[2] + seconds


def summary(repeats: list[dict[str, ArmTotals]]) -> dict:
    """Per arm: tau, speedup over plain per repeat (and their mean), tau and speedup by category (summed over
    repeats)."""
    out = {}
    for label in repeats[0]:
        speedups = [r["plain"].seconds / r[label].seconds for r in repeats]
        cats = {}
        for category in repeats[0][label].by_category:
            tokens = sum(r[label].by_category[category][0] for r in repeats)
            passes = sum(r[label].by_category[category][1] for r in repeats)
            seconds = sum(r[label].by_category[category][2] for r in repeats)
            plain_seconds = sum(r["plain"].by_category[category][2] for r in repeats)
            cats[category] = {"tau": round(tokens / passes, 3), "speedup": round(plain_seconds / seconds, 3)}
        first = repeats[0][label]
        out[label] = {"tau": round(first.tokens / first.passes, 3), "tokens": first.tokens,
                      "speedup_per_repeat": [round(s, 3) for s in speedups],
                      "speedup_mean": round(statistics.mean(speedups), 3), "by_category": cats,
                      "policy_notes": [r[label].note for r in repeats]}
    return out


def markdown(result: dict) -> str:
    arms = [label for label in result["arms"] if label != "plain"]
    lines = ["| arm | tau | speedup (mean of repeats) | per repeat |", "| --- | ---: | ---: | --- |"]
    for label in arms:
        row = result["arms"][label]
        lines.append(f"| {label} | {row['tau']:.2f} | {row['speedup_mean']:.2f} | "
                     f"{', '.join(f'{s:.2f}' for s in row['speedup_per_repeat'])} |")
    lines += ["", "| category | " + " | ".join(f"{a} tau / speedup" for a in arms) + " |",
              "| --- |" + " ---: |" * len(arms)]
    for category in result["arms"]["plain"]["by_category"]:
        cells = [result["arms"][a]["by_category"][category] for a in arms]
        lines.append(f"| {category} | " + " | ".join(f"{c['tau']:.2f} / {c['speedup']:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help='arms as JSON: {"name": drafter, ...options} (a "label" key names '
                                                 "the arm)")
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="auto")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--breakdown", action="store_true", help="time each pass's parts (pass_breakdown.py)")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(HERE))
    from pass_breakdown import Breakdown, TargetTap

    from specfamily.zoo.prompts import prompt_ids

    clock = time.process_time if args.threads == 1 else time.perf_counter
    started, load_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()[0]
    target = sf.load_target(args.target, matmul=args.matmul)
    [warm] = prompt_ids("instruct", 1, target.tokenizer)
    turns, plain = default_turns(target, args.per_category, args.max_new_tokens)
    specs = {"plain": None}
    for text in args.specs:
        spec = json.loads(text)
        specs[spec.pop("label", spec["name"])] = spec
    tap = TargetTap(target, clock) if args.breakdown else None
    breakdowns = {label: Breakdown(clock, tap) for label in specs} if args.breakdown else {}
    repeats, layers = [], None
    for repeat in range(args.repeats):
        arms = {label: make_arm(target, spec, warm) for label, spec in specs.items()}
        for label, drafter in arms.items():
            if args.breakdown:
                breakdowns[label].attach(target, drafter)
            if drafter is not None and isinstance(drafter.needs_features, tuple):
                layers = drafter.needs_features
        repeats.append(run_repeat(target, arms, turns, plain, args.max_new_tokens, clock, repeat, breakdowns))
        result = {"command": " ".join(sys.argv), "started": started, "load_average_start": round(load_start, 1),
                  "finished": time.strftime("%H:%M UTC", time.gmtime()), "load_average": os.getloadavg()[0],
                  "threads": args.threads, "clock": clock.__name__, "turns": len(turns), "repeats": len(repeats),
                  "arms": summary(repeats), "breakdown": {label: log.report() for label, log in breakdowns.items()}}
        print(markdown(result), flush=True)  # after every repeat: a run stopped early keeps what it measured
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.breakdown and layers:
        result["feature_cost"] = Breakdown.feature_cost(target, warm, layers, clock)
    print(json.dumps({k: result[k] for k in ("breakdown", "feature_cost") if k in result}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
