"""Hydra against Medusa heads on SmolLM2 at equal tree shape: tau (greedy) on the same prompts, text identical.

Every arm drafts the same rank-path trees at a constant depth (tau then does not depend on timings): the top-1 chain
of 4, the shipped Medusa heads' calibrated tree, and a 16-node tree grown from a nominal accuracy profile. Heads:
any number of ``--arm NAME=FAMILY:WEIGHTS`` (FAMILY medusa or hydra). Prompts: Spec-Bench first turns, evenly over
its categories, and optionally the held-out prompts of distillation data (``--distilled DIR``).

    python benchmarks/hydra_vs_medusa.py --threads 1 --prompts 6 --tokens 48 \
        --arm medusa=medusa:zoo:smollm2-medusa --arm hydra=hydra:work/smollm2-hydra/heads --out docs/variants-hydra.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import common


def trees() -> dict[str, list]:
    from specfamily.drafters.medusa.tree import greedy_paths, nominal_accuracies
    from specfamily.zoo import resolve

    shipped = json.loads((Path(resolve("zoo:smollm2-medusa")) / "config.json").read_text())["tree"]
    return {"chain4": "chain", f"medusa{len(shipped)}": shipped,
            "nominal16": [list(p) for p in greedy_paths(nominal_accuracies(4, 8), 16)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", required=True, help="NAME=FAMILY:WEIGHTS")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--distilled", default="", help="also the held-out prompts of this distillation data")
    parser.add_argument("--trees", default="chain4,medusa,nominal16", help="which of the trees, comma-separated")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import specfamily as sf

    common.set_threads(args.threads)
    common.quiet_transformers()
    target = sf.load_target("zoo:smollm2")
    prompts, _ = common.spec_bench_prompts(1, target.tokenizer)
    step = max(1, len(prompts) // args.prompts)
    sets = {"spec_bench": prompts[::step][: args.prompts]}
    if args.distilled:
        from specfamily.train.distilled import load_for_target

        heldout = load_for_target(args.distilled, target)[1]
        sets["heldout"] = [heldout.prompt(i) for i in range(len(heldout))]
    plain = {name: [sf.generate(target, None, p, max_new_tokens=args.tokens).tokens for p in ps]
             for name, ps in sets.items()}
    report = {"tokens": args.tokens, "prompts": {k: len(v) for k, v in sets.items()}, "rows": []}
    for arm in args.arm:
        name, spec = arm.split("=", 1)
        family, weights = spec.split(":", 1)
        wanted = args.trees.split(",")
        chosen = {k: v for k, v in trees().items() if any(k.startswith(w) for w in wanted)}
        for tree_name, tree in chosen.items():
            drafter = sf.create_drafter(family, target, weights=weights, tree=tree, gamma=4, policy="constant")
            for set_name, ps in sets.items():
                tokens = passes = 0
                identical = True
                for prompt, reference in zip(ps, plain[set_name], strict=True):
                    result = sf.generate(target, drafter, prompt, max_new_tokens=args.tokens)
                    identical &= result.tokens == reference
                    tokens, passes = tokens + result.metrics.new_tokens, passes + result.metrics.target_passes
                row = {"arm": name, "family": family, "weights": weights, "tree": tree_name,
                       "nodes": drafter.tree.size, "prompts": set_name, "tau": tokens / passes,
                       "greedy_identical": identical}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
