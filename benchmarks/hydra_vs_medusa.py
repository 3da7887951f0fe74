"""Hydra against Medusa heads on SmolLM2 at equal tree shape: tau (greedy) on the same prompts, text identical.

Every arm drafts the same rank-path trees at a constant depth (tau then does not depend on timings): the top-1 chain
of 4, the shipped Medusa heads' calibrated tree, and a 16-node tree grown from a nominal accuracy profile. Heads:
any number of ``--arm NAME=FAMILY:WEIGHTS`` (FAMILY medusa or hydra). Prompts: ``--per-category`` Spec-Bench first
turns of each of its 13 categories, and optionally the held-out prompts of distillation data (``--distilled DIR``).
Each row has tau overall and by category and whether every text equals plain decoding's. ``--plain FILE`` keeps the
plain references (computed once, reused by later runs on the same prompts); ``--with REPORT`` adds an earlier run's
rows, so arms measured in separate runs land in one table. The last lines: each arm's tau over the first arm's, per
tree (``hydra/medusa``).

    python benchmarks/hydra_vs_medusa.py --threads 1 --per-category 2 --tokens 64 --trees chain4,medusa \
        --arm medusa=medusa:zoo:smollm2-medusa --arm hydra=hydra:zoo:smollm2-hydra --out work/hydra-vs-medusa.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import common


def trees() -> dict[str, list]:
    from specfamily.drafters.medusa.tree import greedy_paths, nominal_accuracies
    from specfamily.zoo import resolve

    shipped = json.loads((Path(resolve("zoo:smollm2-medusa")) / "config.json").read_text())["tree"]
    return {"chain4": "chain", f"medusa{len(shipped)}": shipped,
            "nominal16": [list(p) for p in greedy_paths(nominal_accuracies(4, 8), 16)]}


def plain_references(sf, target, sets: dict, tokens: int, path: str) -> dict[str, list[list[int]]]:
    """Plain decoding's tokens per prompt set, read from ``path`` when it holds these prompts, else computed."""
    if path and Path(path).is_file():
        saved = json.loads(Path(path).read_text())
        if saved["tokens"] == tokens and saved["prompts"] == sets:
            return saved["plain"]
    plain = {name: [sf.generate(target, None, p, max_new_tokens=tokens).tokens for p in ps]
             for name, ps in sets.items()}
    if path:
        Path(path).write_text(json.dumps({"tokens": tokens, "prompts": sets, "plain": plain}))
    return plain


def measure(sf, target, drafter, prompts, categories, reference, tokens: int) -> dict:
    """tau overall and by category (new tokens / target passes) and whether every text equals plain decoding's."""
    new, passes = defaultdict(int), defaultdict(int)
    identical = True
    for prompt, category, expected in zip(prompts, categories, reference, strict=True):
        result = sf.generate(target, drafter, prompt, max_new_tokens=tokens)
        identical &= result.tokens == expected
        new[category] += result.metrics.new_tokens
        passes[category] += result.metrics.target_passes
    return {"tau": sum(new.values()) / sum(passes.values()), "greedy_identical": identical,
            "by_category": {c: round(new[c] / passes[c], 3) for c in new}}


def ratio_lines(rows: list[dict]) -> list[str]:
    """Each arm's tau over the first arm's, per tree and prompt set."""
    if not rows:
        return []
    first = rows[0]["arm"]
    base = {(r["tree"], r["prompts"]): r["tau"] for r in rows if r["arm"] == first}
    return [f"{r['arm']}/{first} {r['tree']} {r['prompts']}: {r['tau'] / base[(r['tree'], r['prompts'])]:.3f}x "
            f"(tau {r['tau']:.3f} vs {base[(r['tree'], r['prompts'])]:.3f})"
            for r in rows if r["arm"] != first and (r["tree"], r["prompts"]) in base]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", default=[], help="NAME=FAMILY:WEIGHTS")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--per-category", type=int, default=1, help="Spec-Bench first turns per category (13)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--distilled", default="", help="also the held-out prompts of this distillation data")
    parser.add_argument("--trees", default="chain4,medusa,nominal16", help="which of the trees, comma-separated")
    parser.add_argument("--plain", default="", help="a JSON file holding plain decoding's tokens (made if absent)")
    parser.add_argument("--with", dest="earlier", action="append", default=[], help="an earlier run's --out report")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import specfamily as sf

    common.set_threads(args.threads)
    common.quiet_transformers()
    target = sf.load_target("zoo:smollm2")
    prompts, categories = common.spec_bench_prompts(args.per_category, target.tokenizer)
    sets, labels = {"spec_bench": prompts}, {"spec_bench": categories}
    if args.distilled:
        from specfamily.train.distilled import load_for_target

        heldout = load_for_target(args.distilled, target)[1]
        sets["heldout"] = [heldout.prompt(i) for i in range(len(heldout))]
        labels["heldout"] = ["heldout"] * len(sets["heldout"])
    plain = plain_references(sf, target, sets, args.tokens, args.plain)
    rows = [row for path in args.earlier for row in json.loads(Path(path).read_text())["rows"]]
    wanted = args.trees.split(",")
    chosen = {k: v for k, v in trees().items() if any(k.startswith(w) for w in wanted)}
    for arm in args.arm:
        name, spec = arm.split("=", 1)
        family, weights = spec.split(":", 1)
        for tree_name, tree in chosen.items():
            drafter = sf.create_drafter(family, target, weights=weights, tree=tree, gamma=4, policy="constant")
            for set_name, ps in sets.items():
                row = {"arm": name, "family": family, "weights": weights, "tree": tree_name,
                       "nodes": drafter.tree.size, "prompts": set_name,
                       **measure(sf, target, drafter, ps, labels[set_name], plain[set_name], args.tokens)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    for line in ratio_lines(rows):
        print(line)
    if args.out:
        report = {"tokens": args.tokens, "prompts": {k: len(v) for k, v in sets.items()}, "rows": rows}
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
