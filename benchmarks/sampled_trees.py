"""EAGLE / EAGLE-3 trees under sampling: top-k children (q = None) against children drawn without replacement
(``tree_sampling="sampled"``, conditional q), beside plain sampled decoding, in one run on one thread.

Per mode: tau (new tokens / target passes, the prefill included), CPU ms per new token, the cost of an average pass
after the prefill (drafting + verification, from the run's metrics, which time passes on the wall clock) relative to
a plain pass of the same run, and tau per unit of that cost. Modes run
interleaved, prompt by prompt and seed by seed (the same seeds for every mode), so a slow stretch of the shared
machine hits them all alike; the spread over rounds is printed.

    PYTHONPATH=. python benchmarks/sampled_trees.py --prompts 8 --new-tokens 96 --seeds 3 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from common import quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf


def modes(args) -> dict[str, dict | None]:
    """name -> create_drafter options (None: plain decoding)."""
    out: dict[str, dict | None] = {"plain": None}
    for name in args.drafters:
        for tree_sampling in ("topk", "sampled"):
            out[f"{name}-{tree_sampling}"] = {"name": name, "mode": "tree", "gamma": args.gamma,
                                              "total_tokens": args.total_tokens, "tree_sampling": tree_sampling}
    return out


def run_one(target, options: dict | None, prompt: list[int], sampling, seed: int, new_tokens: int) -> dict:
    drafter = None
    if options is not None:
        options = dict(options)
        drafter = sf.create_drafter(options.pop("name"), target, **options)
    start = time.process_time()
    result = sf.generate(target, drafter, prompt, max_new_tokens=new_tokens, sampling=sampling, seed=seed)
    seconds = time.process_time() - start
    m = result.metrics
    steady = m.verify_seconds - m.prefill_seconds  # passes after the prefill: what drafting changes
    return {"tokens": m.new_tokens, "passes": m.target_passes, "seconds": seconds,
            "pass_seconds": steady + m.draft_seconds, "verify_seconds": steady}


def summary(rows: list[dict], plain_pass: float) -> dict:
    tokens, passes = sum(r["tokens"] for r in rows), sum(r["passes"] for r in rows)
    tau, steady = tokens / passes, passes - len(rows)  # tau counts the prefill; costs are of the passes after it
    pass_cost = sum(r["pass_seconds"] for r in rows) / steady / plain_pass
    return {"tau": tau, "ms_per_token": 1000 * sum(r["seconds"] for r in rows) / tokens,
            "pass_cost": pass_cost, "verify_cost": sum(r["verify_seconds"] for r in rows) / steady / plain_pass,
            "tau_per_cost": tau / pass_cost}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--drafters", nargs="+", default=["eagle", "eagle3"])
    parser.add_argument("--prompts", type=int, default=8, help="Spec-Bench prompts, spread over its categories")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--total-tokens", type=int, default=12)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_threads(args.threads)
    quiet_transformers()
    torch.manual_seed(0)
    target = sf.load_target(args.target, dtype=torch.float32)
    prompts, _ = spec_bench_prompts(1, target.tokenizer)
    step = max(1, len(prompts) // args.prompts)
    prompts = prompts[::step][: args.prompts]
    sampling = sf.SamplingConfig(temperature=args.temperature, top_p=args.top_p)
    table = modes(args)
    rows: dict[str, list[dict]] = defaultdict(list)
    rounds: dict[str, list[dict]] = defaultdict(list)
    run_one(target, None, prompts[0], sampling, 0, 8)  # warm-up
    for seed in range(args.seeds):
        this_round: dict[str, list[dict]] = defaultdict(list)
        for prompt in prompts:
            for name, options in table.items():
                this_round[name].append(run_one(target, options, prompt, sampling, seed, args.new_tokens))
        plain = summary(this_round["plain"], 1.0)["pass_cost"]
        for name, got in this_round.items():
            rows[name] += got
            rounds[name].append(summary(got, plain))
        print(f"seed {seed}: " + ", ".join(f"{n} tau {s[-1]['tau']:.2f} {s[-1]['ms_per_token']:.1f} ms/tok"
                                          for n, s in rounds.items()), flush=True)
    plain_pass = summary(rows["plain"], 1.0)["pass_cost"]
    plain_ms = summary(rows["plain"], plain_pass)["ms_per_token"]
    print(f"\n{args.target}, {len(prompts)} Spec-Bench prompts x {args.seeds} seeds, {args.new_tokens} new tokens, "
          f"t{args.temperature} top-p {args.top_p}, gamma {args.gamma}, total_tokens {args.total_tokens}, "
          f"{args.threads} thread(s); plain pass {1000 * plain_pass:.1f} ms")
    print("| mode | tau | ms/token | vs plain | pass cost (x plain pass) | verify cost | tau / pass cost "
          "| tau/cost per seed |")
    print("|---|---|---|---|---|---|---|---|")
    for name, got in rows.items():
        s = summary(got, plain_pass)
        spread = " ".join(f"{r['tau_per_cost']:.3f}" for r in rounds[name])
        print(f"| {name} | {s['tau']:.3f} | {s['ms_per_token']:.1f} | {plain_ms / s['ms_per_token']:.3f}x "
              f"| {s['pass_cost']:.3f} | {s['verify_cost']:.3f} | {s['tau_per_cost']:.3f} | {spread} |")
    stdev = {n: statistics.pstdev([r["tau"] for r in rounds[n]]) for n in rows}
    print("tau spread over seeds (population sd): " + ", ".join(f"{n} {v:.3f}" for n, v in stdev.items()))


if __name__ == "__main__":
    main()
