"""Suffix decoding vs prompt lookup vs plain decoding (greedy, one run, prompts interleaved across arms).

Two workloads on one target (default ``zoo:smollm2``):
- Spec-Bench first turns in category order, ``--per-category`` questions each; one suffix drafter serves every
  question, so its global cache grows across them (as it would in a server).
- a repeated-task workload (:mod:`specfamily.recipes.repeated`): three instructions, each asked about ``--tasks``
  held-out zoo-corpus functions. ``suffix cold`` starts with an empty global cache; ``suffix warm`` loads a cache
  (``save_cache`` / ``cache=``) written by a run over *other* functions with the same instructions: primed on
  purpose (the scenario measured: a server that has answered such tasks before), never with a timed prompt's answer.

No arm is warmed up, and every arm serves each prompt once, so no timed request meets a drafter that has seen it.

Every arm runs at its defaults (the cost-aware policy) and its tokens are checked against plain decoding's.
Printed: tau and speedup over plain decoding (total time ratio) per workload and per category; then, from plain
decoding's outputs, the teacher-forced tau (:mod:`suffix_replay`: exactly a real greedy run's) of prompt lookup,
suffix and suffix with the paper's options at the same maximum draft size (``--same-size``, constant policy) per
Spec-Bench category, with suffix's proposal time per call as a share of a plain target pass (prefill included in
the pass average); the global cache's memory per 1k cached tokens (tracemalloc, against the depth-64 trie the
index replaced)::

    python benchmarks/suffix.py                                   # ~12 min on 2 idle CPU threads
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
PAPER = {"max_spec_factor": 1.0, "max_spec_offset": 0.0, "choose": "score"}  # SuffixDecoding's own rules


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
    outputs: list[list[int]] = field(default_factory=list)  # each item's new tokens


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
            results[name].outputs.append(result.tokens)
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
    """The global cache's size: tokens, index states, bytes (the index's estimate) and MB per 1k cached tokens
    measured with tracemalloc for its index and for the depth-64 suffix trie it replaced, over the same sequences."""
    from suffix_peer import build, traced_bytes

    from specfamily.drafters.suffix.automaton import SuffixIndex
    from specfamily.drafters.suffix.tree import SuffixTrie

    cache = drafter.global_cache
    per_k = 1000 / cache.tokens if cache.tokens else float("nan")
    sequences, depth = list(cache.sequences), cache.max_depth
    traced = {name: traced_bytes(lambda cls=cls: build(cls, sequences, depth))[1] * per_k / 1e6
              for name, cls in (("index", SuffixIndex), ("trie", SuffixTrie))}
    return {"tokens": cache.tokens, "states": len(cache.index), "bytes": cache.index.nbytes(),
            "states_per_1k_tokens": len(cache.index) * per_k, "mb_per_1k_tokens": traced["index"],
            "trie_mb_per_1k_tokens": traced["trie"]}


def plain_outputs(target, items: Sequence[Item], known: dict[tuple[int, ...], list[int]],
                  max_new_tokens: int) -> list[list[int]]:
    """Plain greedy decoding's new tokens for each item: from ``known`` (prompt -> output) or generated (untimed)."""
    return [known[tuple(item.ids)] if tuple(item.ids) in known
            else sf.generate(target, None, item.ids, max_new_tokens=max_new_tokens).tokens for item in items]


def same_size_rows(target, items: Sequence[Item], outputs: list[list[int]], pass_seconds: float,
                   max_new_tokens: int, gammas: Sequence[int], suffix: dict | None = None) -> list[dict]:
    """Teacher-forced tau per category of prompt lookup, suffix and suffix with the paper's rules at each maximum
    draft size (constant policy) from plain decoding's ``outputs``, and each one's proposal time per call over a
    plain pass of ``pass_seconds`` (one drafter object per arm and size over every item in order, as in a run)."""
    from suffix_replay import Workload, replay_workload

    work = Workload([i.ids for i in items], [i.category for i in items], outputs, max_new_tokens)
    rows = []
    for gamma in gammas:
        arms = {"prompt_lookup": make_drafter(target, "prompt_lookup", gamma),
                "suffix": make_drafter(target, "suffix", gamma, suffix=suffix),
                "suffix (paper)": make_drafter(target, "suffix", gamma, PAPER)}
        for name, drafter in arms.items():
            for category, sums in replay_workload(name, drafter, target, work).items():
                rows.append({"gamma": gamma, "arm": name, "category": category, "tau": sums.tau,
                             "proposal_share_of_pass": sums.draft_seconds / sums.passes / pass_seconds})
    return rows


def same_size_markdown(rows: list[dict]) -> str:
    """One line per category: tau of each arm at each size, and suffix's largest proposal share."""
    columns = list(dict.fromkeys((r["gamma"], r["arm"]) for r in rows))
    table = {(r["category"], r["gamma"], r["arm"]): r for r in rows}
    lines = ["### Spec-Bench, teacher-forced tau at the same maximum draft size", "",
             "| category | " + " | ".join(f"{arm} @{gamma}" for gamma, arm in columns) + " | suffix proposal / pass |",
             "| --- |" + " ---: |" * (len(columns) + 1)]
    for category in dict.fromkeys(r["category"] for r in rows):
        taus = [f"{table[(category, gamma, arm)]['tau']:.3f}" for gamma, arm in columns]
        share = max(table[(category, gamma, arm)]["proposal_share_of_pass"] for gamma, arm in columns
                    if arm == "suffix")
        lines.append(f"| {category} | " + " | ".join(taus) + f" | {share:.2%} |")
    return "\n".join(lines)


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
    from specfamily.io.chat import chat_prompt_ids
    from specfamily.recipes.repeated import heldout_functions, repeated_task_rows

    rows = repeated_task_rows(heldout_functions(limit=offset + tasks), tasks, offset=offset)
    return [Item(row["category"], chat_prompt_ids(tokenizer, row["turns"])) for row in rows]


def spec_bench_workload(target, items: list[Item], args) -> dict:
    names = (PLAIN, "prompt_lookup", "suffix", "suffix:chain")
    arms = {name: make_drafter(target, name, args.gamma, suffix=suffix_options(args)) for name in names}
    results = run_workload(target, arms, items, args.max_new_tokens)
    plain = results[0]
    known = {tuple(item.ids): output for item, output in zip(items, plain.outputs, strict=True)}
    wide = spec_bench_items(target.tokenizer, args.same_size_per_category) if args.same_size_per_category else items
    outputs = plain_outputs(target, wide, known, args.max_new_tokens)
    same_size = same_size_rows(target, wide, outputs, plain.total.seconds / plain.total.passes, args.max_new_tokens,
                               args.same_size, suffix_options(args))
    return {"rows": summary_rows(results), "same_size": same_size, "memory": cache_memory(arms["suffix"])}


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
    return {} if args.suffix_offset is None else {"max_spec_offset": args.suffix_offset}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--per-category", type=int, default=1, help="Spec-Bench questions per category")
    parser.add_argument("--tasks", type=int, default=4, help="functions per instruction in the repeated workload")
    parser.add_argument("--gamma", type=int, default=None,
                        help="maximum draft size of every drafter (constant policy); default: each one's own")
    parser.add_argument("--suffix-offset", type=float, default=None,
                        help="the suffix arms' max_spec_offset (paper: 0; default: the drafter's own)")
    parser.add_argument("--same-size", type=lambda s: [int(g) for g in s.split(",")], default=[4, 16],
                        help="maximum draft sizes of the teacher-forced comparison (comma-separated)")
    parser.add_argument("--same-size-per-category", type=int, default=4,
                        help="Spec-Bench questions per category of the teacher-forced comparison (plain outputs of "
                        "the timed run's, the others decoded untimed); 0: the timed run's questions only")
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
        print(same_size_markdown(report["spec_bench"]["same_size"]), flush=True)
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
