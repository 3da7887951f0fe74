"""Suffix decoding vs prompt lookup vs plain decoding (greedy, one run, prompts interleaved across arms).

Two workloads on one target (default ``zoo:smollm2``):
- Spec-Bench first turns in category order, ``--per-category`` questions each; one suffix drafter serves every
  question, so its global cache grows across them (as it would in a server).
- a repeated-task workload (:mod:`specfamily.eval.repeated`): three instructions, each asked about ``--tasks``
  held-out zoo-corpus functions. ``suffix cold`` starts with an empty global cache; ``suffix warm`` loads a cache
  (``save_cache`` / ``cache=``) written by a run over *other* functions with the same instructions.

Every arm's tokens are checked against plain decoding's. Printed: tau and speedup over plain decoding (total time
ratio) per workload and per category, the suffix drafter's proposal time as a share of a plain target pass, and
its global cache's memory per 1k cached tokens::

    python benchmarks/suffix.py                                   # ~15 min on 2 CPU threads
    python benchmarks/suffix.py --per-category 1 --tasks 2 --max-new-tokens 64 --out suffix.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import specfamily as sf

PLAIN = "plain"


@dataclass
class Item:
    category: str
    ids: list[int]


@dataclass
class Totals:
    """One arm's sums over a set of prompts."""

    tokens: int = 0
    passes: int = 0
    seconds: float = 0.0
    draft_seconds: float = 0.0
    draft_steps: int = 0
    proposed: int = 0
    mismatches: int = 0  # prompts whose tokens differ from plain decoding's

    def add(self, result, mismatch: bool) -> None:
        m = result.metrics
        self.tokens += m.new_tokens
        self.passes += m.target_passes
        self.seconds += m.total_seconds
        self.draft_seconds += m.draft_seconds
        self.draft_steps += m.draft_steps
        self.proposed += m.proposed_tokens
        self.mismatches += mismatch

    @property
    def tau(self) -> float:
        return self.tokens / self.passes if self.passes else float("nan")


@dataclass
class ArmResult:
    name: str
    total: Totals = field(default_factory=Totals)
    by_category: dict[str, Totals] = field(default_factory=dict)


def make_drafter(target, name: str, gamma: int | None, options: dict | None = None, suffix: dict | None = None):
    """An arm's drafter: ``plain`` (None), ``prompt_lookup``, ``suffix`` or ``suffix:chain``; ``gamma`` is the
    maximum draft size of each (prompt lookup's chain length, suffix's depth cap and tree size); ``suffix``: options
    of the suffix arms only."""
    if name == PLAIN:
        return None
    drafter, _, mode = name.partition(":")
    options = dict(options or {})
    if drafter == "suffix":
        options.update(suffix or {})
    if gamma is not None:
        options["gamma"] = gamma
        if drafter == "suffix":
            options["max_tree_size"] = gamma
    if drafter == "suffix" and mode:
        options["mode"] = mode
    return sf.create_drafter(drafter, target, **options)


def run_workload(target, arms: dict[str, object], items: Sequence[Item], max_new_tokens: int) -> list[ArmResult]:
    """Generate every item with every arm in turn (plain first, the reference), prompt by prompt."""
    if next(iter(arms), None) != PLAIN:
        raise ValueError("the first arm must be plain decoding (the reference)")
    results = {name: ArmResult(name) for name in arms}
    for item in items:
        reference = None
        for name, drafter in arms.items():
            result = sf.generate(target, drafter, item.ids, max_new_tokens=max_new_tokens)
            reference = result.tokens if reference is None else reference
            mismatch = result.tokens != reference
            for totals in (results[name].total, results[name].by_category.setdefault(item.category, Totals())):
                totals.add(result, mismatch)
    return list(results.values())


def warm_cache(target, items: Sequence[Item], max_new_tokens: int, path: Path, gamma: int | None,
               suffix: dict | None = None) -> Path:
    """Run a suffix drafter over ``items`` (untimed) and save its global cache to ``path``."""
    drafter = make_drafter(target, "suffix", gamma, suffix=suffix)
    for item in items:
        sf.generate(target, drafter, item.ids, max_new_tokens=max_new_tokens)
    return drafter.save_cache(path)


def cache_memory(drafter) -> dict:
    """The global cache's size: tokens, trie nodes and approximate bytes, and both per 1k cached tokens."""
    cache = drafter.global_cache
    per_k = 1000 / cache.tokens if cache.tokens else float("nan")
    return {"tokens": cache.tokens, "states": len(cache.index), "bytes": cache.index.nbytes(),
            "states_per_1k_tokens": len(cache.index) * per_k, "mb_per_1k_tokens": cache.index.nbytes() * per_k / 1e6}


def summary_rows(results: list[ArmResult]) -> list[dict]:
    """Per arm (and per category): tau, speedup over plain, proposal time / plain pass, tokens identical."""
    plain = results[0]
    rows = []
    for arm in results:
        for category, totals in [("all", arm.total), *arm.by_category.items()]:
            base = plain.total if category == "all" else plain.by_category[category]
            pass_seconds = base.seconds / base.passes if base.passes else float("nan")
            proposal = totals.draft_seconds / totals.draft_steps if totals.draft_steps else 0.0
            rows.append({"arm": arm.name, "category": category, "tau": totals.tau,
                         "speedup": base.seconds / totals.seconds if totals.seconds else float("nan"),
                         "proposal_share_of_pass": proposal / pass_seconds, "proposed": totals.proposed,
                         "tokens": totals.tokens, "identical": totals.mismatches == 0})
    return rows


def markdown(title: str, rows: list[dict]) -> str:
    lines = [f"### {title}", "", "| arm | category | tau | speedup vs plain | proposal / pass | identical |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for row in rows:
        lines.append(f"| {row['arm']} | {row['category']} | {row['tau']:.2f} | {row['speedup']:.2f} | "
                     f"{row['proposal_share_of_pass']:.1%} | {'yes' if row['identical'] else 'NO'} |")
    return "\n".join(lines)


def spec_bench_items(tokenizer, per_category: int) -> list[Item]:
    import common

    prompts, categories = common.spec_bench_prompts(per_category, tokenizer)
    return [Item(c, ids) for ids, c in zip(prompts, categories, strict=True)]


def repeated_items(tokenizer, tasks: int, offset: int) -> list[Item]:
    from specfamily.eval.chat import chat_prompt_ids
    from specfamily.eval.repeated import heldout_functions, repeated_task_rows

    rows = repeated_task_rows(heldout_functions(limit=offset + tasks), tasks, offset=offset)
    return [Item(row["category"], chat_prompt_ids(tokenizer, row["turns"])) for row in rows]


def spec_bench_workload(target, items: list[Item], args) -> dict:
    names = (PLAIN, "prompt_lookup", "suffix", "suffix:chain")
    arms = {name: make_drafter(target, name, args.gamma, suffix=suffix_options(args)) for name in names}
    results = run_workload(target, arms, items, args.max_new_tokens)
    return {"rows": summary_rows(results), "memory": cache_memory(arms["suffix"])}


def repeated_workload(target, items: list[Item], warm_items: list[Item], args) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = warm_cache(target, warm_items, args.max_new_tokens, Path(folder) / "warm.safetensors", args.gamma,
                          suffix_options(args))
        arms = {PLAIN: None, "prompt_lookup": make_drafter(target, "prompt_lookup", args.gamma),
                "suffix cold": make_drafter(target, "suffix", args.gamma, suffix=suffix_options(args)),
                "suffix warm": make_drafter(target, "suffix", args.gamma, {"cache": str(path)}, suffix_options(args))}
        results = run_workload(target, arms, items, args.max_new_tokens)
    return {"rows": summary_rows(results), "memory": cache_memory(arms["suffix warm"])}


def suffix_options(args: argparse.Namespace) -> dict:
    return {"max_spec_offset": args.suffix_offset} if args.suffix_offset else {}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--per-category", type=int, default=1, help="Spec-Bench questions per category")
    parser.add_argument("--tasks", type=int, default=4, help="functions per instruction in the repeated workload")
    parser.add_argument("--gamma", type=int, default=None,
                        help="maximum draft size of every drafter (constant policy); default: each one's own")
    parser.add_argument("--suffix-offset", type=float, default=0.0,
                        help="the suffix arms' max_spec_offset (paper: 0): tokens a match proposes beyond its length")
    parser.add_argument("--workloads", default="spec_bench,repeated")
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    import common

    args = parse_args(argv)
    common.set_threads(args.threads)
    common.quiet_transformers()
    target, _ = common.load_pair(args.target, None, matmul="auto")
    report: dict = {"args": vars(args), "torch": torch.__version__}
    workloads = set(args.workloads.split(","))
    if "spec_bench" in workloads:
        report["spec_bench"] = spec_bench_workload(target, spec_bench_items(target.tokenizer, args.per_category),
                                                   args)
        print(markdown("Spec-Bench, category order, global cache kept", report["spec_bench"]["rows"]), flush=True)
        print(f"global cache: {report['spec_bench']['memory']}", flush=True)
    if "repeated" in workloads:
        items = repeated_items(target.tokenizer, args.tasks, 0)
        warm = repeated_items(target.tokenizer, args.tasks, args.tasks)
        report["repeated"] = repeated_workload(target, items, warm, args)
        print(markdown("Repeated tasks, cold vs warm cache", report["repeated"]["rows"]), flush=True)
        print(f"global cache (warm arm): {report['repeated']['memory']}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=lambda o: asdict(o)))
    return report


if __name__ == "__main__":
    main()
