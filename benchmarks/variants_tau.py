"""tau, rows fed per pass and the cost-curve speedup of drafter settings on Spec-Bench first turns (one per category).

For choosing defaults on a loaded machine: tau is a count, so it does not depend on the load; the speedup printed is
*predicted* from the target's verify-cost curve c(g) (measured once at the start, CPU time on one thread): new
tokens / (sum over passes of c(rows the pass fed beyond the root), 1 for a pass that drafted nothing). Each spec is a
drafter name with options, as JSON; one drafter object serves every prompt in turn (tables and caches grow across
prompts, as in a server) after one untimed 16-token generation on the zoo's first instruct prompt. Every text is
checked against plain decoding's. One JSON line per spec::

    python benchmarks/variants_tau.py --threads 1 --max-new-tokens 64 \\
        '{"name": "recycling"}' '{"name": "prompt_lookup"}' '{"name": "lookahead", "window": 1, "ngram": 3}'
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import torch
from suffix import spec_bench_items

import specfamily as sf


def count_fed(drafter) -> list[int]:
    """Record, per proposal, the rows it feeds beyond the root (draft nodes plus side rows)."""
    fed: list[int] = []
    propose = drafter.propose

    def counting(ctx, gamma):
        draft = propose(ctx, gamma)
        fed.append(len(draft.tokens) + (len(draft.side.tokens) if draft.side is not None else 0))
        return draft

    drafter.propose = counting
    return fed


def measure(target, spec: dict, items, plain: list[list[int]], curve, warm: list[int], max_new_tokens: int) -> dict:
    options = dict(spec)
    drafter = sf.create_drafter(options.pop("name"), target, **options)
    fed = count_fed(drafter)
    sf.generate(target, drafter, warm, max_new_tokens=16)
    fed.clear()
    tokens = passes = 0
    cost, categories, start = 0.0, {}, time.process_time()
    for item, reference in zip(items, plain, strict=True):
        before = len(fed)
        result = sf.generate(target, drafter, item.ids, max_new_tokens=max_new_tokens)
        if result.tokens != reference:
            raise AssertionError(f"{spec}: {item.category} differs from plain decoding")
        drafted = fed[before:]
        decode_passes = result.metrics.target_passes - 1
        cost += 1 + sum(curve(g) if g else 1.0 for g in drafted) + decode_passes - len(drafted)
        categories[item.category] = round(len(result.tokens) / result.metrics.target_passes, 2)
        tokens += len(result.tokens)
        passes += result.metrics.target_passes
    return {"spec": spec, "tau": round(tokens / passes, 3), "predicted_speedup": round(tokens / cost, 3),
            "mean_fed": round(sum(fed) / max(len(fed), 1), 2), "proposals": len(fed), "passes": passes,
            "cpu_seconds": round(time.process_time() - start, 1), "tau_by_category": categories}


def main(argv: Sequence[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", help='JSON: {"name": drafter, ...options}')
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="stream")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specfamily.core.costs import target_cost_curve
    from specfamily.zoo.prompts import prompt_ids

    target = sf.load_target(args.target, matmul=args.matmul)
    items = spec_bench_items(target.tokenizer, args.per_category)
    [warm] = prompt_ids("instruct", 1, target.tokenizer)
    curve = target_cost_curve(target, warm)
    print(json.dumps({"cost_curve": {g: round(curve(g), 3) for g in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)}}), flush=True)
    plain = [sf.generate(target, None, item.ids, max_new_tokens=args.max_new_tokens).tokens for item in items]
    rows = []
    for spec in args.specs:
        rows.append(measure(target, json.loads(spec), items, plain, curve, warm, args.max_new_tokens))
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
