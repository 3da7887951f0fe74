"""8-bit against float drafts on SmolLM2: draft cost c, acceptance and speed over plain decoding, side by side.

Arms per prompt, interleaved (the order rotates with the prompt): plain decoding, the drafter with float weights and
with ``quantize=8``, each at its defaults (cost-aware policy) and at a constant gamma (acceptance compared at equal
draft length). Clock: CPU time of this process (``time.process_time``) on one thread, so other work on the machine
shows less; also the direct cost of one draft step: the draft's one-token forward over the target's, medians.

    python benchmarks/quant_drafts.py --threads 1 --prompts 6 --tokens 48 --out docs/variants-quant.json
    python benchmarks/quant_drafts.py --drafter medusa --threads 1      # medusa / hydra heads instead
    python benchmarks/quant_drafts.py --drafter eagle3 --threads 1      # eagle / eagle3: one layer step + head
    python benchmarks/quant_drafts.py --drafter eagle --arms plain,float-g,int8-g,int8fh-g   # int8fh: eagle's int8
                                                                        # layer with the float head rows
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common
import torch

from specfamily.runtime.int8_matmul import int8_kernel

ARMS = ("plain", "float", "int8", "float-g", "int8-g")
KNOWN_ARMS = ARMS + ("int8fh", "int8fh-g")  # int8fh: eagle with quantize=8 and quantize_head=false


def make_drafter(sf, target, name: str, arm: str, gamma: int):
    if arm == "plain":
        return None
    options = {"quantize": 8 if arm.startswith("int8") else 0}
    if arm.startswith("int8fh"):
        options["quantize_head"] = False
    if arm.endswith("-g"):
        options["gamma"] = gamma
    return sf.create_drafter(name, target, **options)


@torch.inference_mode()
def step_costs(target, drafters: dict, repeats: int) -> dict:
    """Median CPU seconds of one draft step (small_model: one-token forward; heads: one proposal) per arm, and of
    the target's one-token pass."""
    prompt = list(range(100, 164))

    def target_pass():
        target.reset()
        target.forward(torch.tensor(prompt))
        target.commit([])
        started = time.process_time()
        target.forward(torch.tensor([5]))
        seconds = time.process_time() - started
        target.commit([])
        return seconds

    out = {"target": statistics.median(target_pass() for _ in range(repeats))}
    for arm, drafter in drafters.items():
        runner = getattr(drafter, "runner", None)
        if runner is None:
            if hasattr(drafter, "_draft_logits"):  # eagle / eagle3: one layer step over one row and its head
                out[arm] = statistics.median(feature_step(drafter, prompt) for _ in range(repeats))
            continue

        def draft_step(runner=runner):
            runner.reset()
            runner.forward(torch.tensor(prompt))
            runner.commit([])
            started = time.process_time()
            runner.forward(torch.tensor([5]))
            seconds = time.process_time() - started
            runner.commit([])
            return seconds

        out[arm] = statistics.median(draft_step() for _ in range(repeats))
    target.reset()
    return out


def feature_step(drafter, prompt: list[int]) -> float:
    """CPU seconds of one EAGLE draft step at one row: the layer over (feature, token) after a 64-pair cache, then
    the head (the same calls a chain draft makes per depth)."""
    from transformers import DynamicCache

    width, dtype = drafter.model.hidden_size, next(drafter.model.parameters()).dtype
    gen = torch.Generator().manual_seed(0)
    cache = DynamicCache()
    n = len(prompt)
    drafter._step(torch.tensor([prompt]), torch.randn(1, n, width, generator=gen, dtype=dtype),
                  torch.arange(n)[None], None, cache)
    feature = torch.randn(1, 1, width, generator=gen, dtype=dtype)
    started = time.process_time()
    hidden = drafter._step(torch.tensor([[5]]), feature, torch.tensor([[n]]), None, cache)
    drafter._draft_logits(hidden[0, -1])
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", default="small_model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=6, help="Spec-Bench first turns (evenly over categories)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    parser.add_argument("--matmul", default="auto",
                        help="the target's matmul kind; auto (the CLI's default: the stream kernel on this CPU)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(KNOWN_ARMS)}")
    args = parser.parse_args(argv)
    arms = tuple(args.arms.split(","))
    if "plain" not in arms or not set(arms) <= set(KNOWN_ARMS):
        parser.error(f"--arms must include plain and name only {', '.join(KNOWN_ARMS)}, got {args.arms!r}")
    import specfamily as sf

    common.set_threads(args.threads)
    common.quiet_transformers()
    target = sf.load_target("zoo:smollm2", matmul=args.matmul)
    prompts, categories = common.spec_bench_prompts(1, target.tokenizer)
    step = max(1, len(prompts) // args.prompts)
    prompts, categories = prompts[::step][: args.prompts], categories[::step][: args.prompts]
    drafters = {arm: make_drafter(sf, target, args.drafter, arm, args.gamma) for arm in arms}
    steps = step_costs(target, drafters, args.repeats)
    print(json.dumps({"step_seconds": steps}), flush=True)
    totals = {arm: {"tokens": 0, "passes": 0, "seconds": 0.0, "accepted": 0, "drafted": 0, "c": [], "rest": [0, 0.0]}
              for arm in arms}  # rest: tokens and seconds past the first prompt (its one-time calibration)
    texts = {}
    for i, prompt in enumerate(prompts):
        order = arms[i % len(arms):] + arms[: i % len(arms)]
        for arm in order:
            started = time.process_time()
            result = sf.generate(target, drafters[arm], prompt, max_new_tokens=args.tokens)
            row = totals[arm]
            row["seconds"] += time.process_time() - started
            if i:
                row["rest"][0] += result.metrics.new_tokens
                row["rest"][1] += time.process_time() - started
            m = result.metrics
            row["tokens"] += m.new_tokens
            row["passes"] += m.target_passes
            row["accepted"] += m.accepted_tokens
            row["drafted"] += m.proposed_tokens
            if m.draft_steps and m.c == m.c:
                row["c"].append(m.c)
            texts.setdefault(i, {})[arm] = result.tokens
            print(json.dumps({"prompt": i, "arm": arm, "tokens": m.new_tokens, "passes": m.target_passes,
                              "accepted": m.accepted_tokens, "proposed": m.proposed_tokens, "c": m.c,
                              "cpu_seconds": time.process_time() - started}), flush=True)
    identical = all(len({tuple(v) for v in per.values()}) == 1 for per in texts.values())
    plain_rate = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    plain_rest = totals["plain"]["rest"][0] / max(totals["plain"]["rest"][1], 1e-9)
    report = {"drafter": args.drafter, "prompts": len(prompts), "categories": categories, "tokens": args.tokens,
              "gamma": args.gamma, "threads": args.threads, "matmul": args.matmul, "greedy_identical": identical,
              "int8_kernel": int8_kernel().isa or f"torch.ao ({int8_kernel().reason})",
              "arms": {},
              "step_seconds": steps}
    for arm, row in totals.items():
        report["arms"][arm] = {
            "tau": row["tokens"] / max(row["passes"], 1),
            "acceptance": row["accepted"] / row["drafted"] if row["drafted"] else None,  # accepted / proposed
            "c_run_median": statistics.median(row["c"]) if row["c"] else None,
            "speedup": (row["tokens"] / row["seconds"]) / plain_rate, "cpu_seconds": row["seconds"],
            "speedup_without_first": (row["rest"][0] / max(row["rest"][1], 1e-9)) / plain_rest if len(prompts) > 1
            else None}
    for arm in steps.keys() & report["arms"].keys():
        report["arms"][arm]["c_step"] = steps[arm] / steps["target"]
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
