"""What a drafter costs at batch 1 on the passes it does not draft, and what its probes cost and win.

For every registered family at its defaults (``sf.create_drafter(name, target)``), Spec-Bench first turns (chat
template, one per category, ``--prompts`` of them spread over the categories) are decoded through ``sf.generate`` in
three arms, interleaved prompt by prompt (the order rotated on each prompt) and repeated ``--repeats`` times:

- ``plain``: no drafter;
- ``idle``: the drafter attached, its policy asked every pass and answered 0 (:func:`decline`): it begins, observes
  every pass (features included), is timed and decides, but never drafts. A cost-aware (``auto``) policy is put in its
  own idle state first: its c estimate set so high that no length pays, so it plans every pass as it does when idle;
- ``default``: the drafter at its defaults, a fresh object per repeat (as a run, it learns across that repeat's
  prompts), after one warm-up request served by another object.

Clock: CPU time (``time.process_time``, one thread; ``--clock wall`` with more threads, on an idle machine). Per arm:
CPU ms per decode pass (every pass after the prefill, from the loop's first proposal after it to the end of the request)
and per new token (the whole request, prefill included, as a run's speedup counts it). The idle arm's extra time is
split by wrapping the calls it adds (the policy's ``next_gamma`` / ``timed`` / the loop's ``_report``; the drafter's
``observe``, ``begin`` and ``end``; the loop's ``_outcome``, which gathers the feature rows), and the features the
target returns are timed apart (one-token passes with and without them, alternating); what is left of idle - plain is
the rest of the loop plus noise. The default arm's passes are classified by its policy (plain, cold: before c is known,
probe, chosen) and each drafted pass is costed in the same request's plain passes: the probes' share of passes, their
cost and the tokens they and the drafted passes after them bring. Every arm's tokens are checked against plain
decoding's (idle: identical at any sampling; default: identical when greedy).

    python benchmarks/idle_cost.py --threads 1 --prompts 4 --repeats 2 --tokens 64
    python benchmarks/idle_cost.py --threads 1 --sampling chat --drafters self_spec,eagle3,small_model
    python benchmarks/idle_cost.py --threads 2 --clock wall --prompts 3 \\
        --drafters eagle,eagle3,hydra,medusa,rest,self_spec,small_model
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch
from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts
from idle_meter import NEVER_PAYS_C, Meter, PassKinds, decline, instrument, instrument_loop, log_passes, probe_table

import specfamily as sf
from specfamily.core.types import SamplingConfig

SAMPLING = {"greedy": SamplingConfig(), "chat": SamplingConfig(temperature=0.7, top_p=0.9)}
ARMS = ("plain", "idle", "default")


def pick_prompts(tokenizer, count: int) -> list[list[int]]:
    """``count`` Spec-Bench first turns, one per category, spread over the 13 categories."""
    prompts, _ = spec_bench_prompts(1, tokenizer)
    step = len(prompts) / count
    return [prompts[int(i * step)] for i in range(count)]


def run_arm(meter: Meter, target, drafter, prompt, seed: int, args) -> dict:
    """One request in one arm: CPU seconds (total and decode), passes, tokens, the meter's log."""
    meter.start()
    start = meter.clock()
    result = sf.generate(target, drafter, prompt, args.tokens, SAMPLING[args.sampling], seed=seed)
    end = meter.clock()
    log = meter.stop(end)
    decode = end - log.starts[1] if len(log.starts) > 1 else 0.0
    prefill = log.starts[1] - start if len(log.starts) > 1 else end - start
    return {"seconds": end - start, "decode": decode, "prefill": prefill, "decode_passes": max(len(log.starts) - 1, 0),
            "tokens": result.tokens, "passes": result.metrics.target_passes, "log": log,
            "drafted": result.metrics.drafted_passes}


def feature_cost(target, drafter, prompt: list[int], passes: int, clock) -> tuple[float, float]:
    """(median, spread) of the extra CPU seconds of a one-token pass that returns the drafter's features over one that
    returns none: ``passes`` pairs of passes over the prompt's cache, alternating; spread = half the difference of
    the two halves' estimates (a noise gauge)."""
    wanted = drafter.needs_features
    if not wanted or passes < 2:
        return 0.0, 0.0
    ids = target.check_ids(prompt)
    target.reset()
    target.forward(ids[:-1])
    target.commit([])
    root = ids[-1:]
    extra = []
    for i in range(passes + 1):  # pair 0 warms up
        seconds = []
        for features in (False, wanted) if i % 2 else (wanted, False):
            start = clock()
            target.forward(root, features=features)
            target.commit([])
            seconds.append(clock() - start)
        if i:
            extra.append(seconds[1] - seconds[0] if i % 2 else seconds[0] - seconds[1])
    target.reset()
    half = len(extra) // 2
    return statistics.median(extra), abs(statistics.median(extra[:half]) - statistics.median(extra[half:])) / 2


def family(meter: Meter, target, name: str, prompts, args) -> dict:
    """Every arm of one family over the prompts, ``args.repeats`` times; the raw runs per arm."""
    idle = sf.create_drafter(name, target)
    decline(idle)
    instrument(meter, idle)
    run_arm(meter, target, idle, prompts[0], 0, args)  # warm-up: the cost curve, kernels, lazy setup
    warm = sf.create_drafter(name, target)
    instrument(meter, warm)
    log_passes(meter, warm)
    run_arm(meter, target, warm, prompts[0], 0, args)  # the default's warm-up, by another object
    runs: dict[str, list] = defaultdict(list)
    for repeat in range(args.repeats):
        default = sf.create_drafter(name, target)
        instrument(meter, default)
        log_passes(meter, default)
        for i, prompt in enumerate(prompts):
            order = ARMS[(i + repeat) % 3:] + ARMS[: (i + repeat) % 3]
            for arm in order:
                drafter = {"plain": None, "idle": idle, "default": default}[arm]
                runs[arm].append(run_arm(meter, target, drafter, prompt, i, args))
    runs["features"] = feature_cost(target, idle, prompts[0], args.feature_passes, meter.clock)
    return runs


def per_pass(runs: list[dict]) -> float:
    """CPU ms per decode pass over the runs."""
    return 1e3 * sum(r["decode"] for r in runs) / max(sum(r["decode_passes"] for r in runs), 1)


def prefill(runs: list[dict]) -> float:
    """CPU ms a request spends before its first decode pass (begin, the prefill pass and its draft), on average."""
    return 1e3 * statistics.mean(r["prefill"] for r in runs)


def per_token(runs: list[dict]) -> float:
    return 1e3 * sum(r["seconds"] for r in runs) / max(sum(len(r["tokens"]) for r in runs), 1)


def spread(runs: dict, args, numerator: str, fn) -> str:
    """min-max over repeats of fn(plain) / fn(arm) (or arm / plain for the idle ratio)."""
    n = len(runs["plain"]) // args.repeats
    ratios = []
    for r in range(args.repeats):
        part = {arm: runs[arm][r * n:(r + 1) * n] for arm in ARMS}
        ratios.append(fn(part[numerator]) / fn(part["plain"]) if numerator == "idle" else
                      fn(part["plain"]) / fn(part[numerator]))
    return f"{min(ratios):.3f}-{max(ratios):.3f}"


def split(runs: dict) -> dict[str, float]:
    """The idle arm's extra microseconds per decode pass, by part."""
    idle, plain = runs["idle"], runs["plain"]
    passes = sum(r["decode_passes"] for r in idle)
    parts = {part: 1e6 * sum(r["log"].spent.get(part, 0.0) for r in idle) / passes for part in Meter.PARTS}
    parts["features"] = 1e6 * runs["features"][0]
    parts["features +-"] = 1e6 * runs["features"][1]
    extra = 1e3 * (per_pass(idle) - per_pass(plain))
    # begin runs before the first decode pass
    parts["rest"] = extra - sum(v for k, v in parts.items() if k not in ("begin", "features +-"))
    parts["extra"] = extra
    return parts


def same_tokens(runs: dict, greedy: bool) -> str:
    plain = [r["tokens"] for r in runs["plain"]]
    idle = sum(r["tokens"] == p for r, p in zip(runs["idle"], plain, strict=True))
    text = f"{idle}/{len(plain)}"
    if greedy:
        text += f", {sum(r['tokens'] == p for r, p in zip(runs['default'], plain, strict=True))}/{len(plain)}"
    return text


def report(results: dict, args) -> None:
    print(f"\nms ({args.clock} clock, {args.threads} thread(s)), {args.tokens} new tokens, {args.prompts} prompts x "
          f"{args.repeats} repeats, sampling {args.sampling}; ratios are of the summed runs, spread = min-max over "
          "repeats")
    print("| drafter | plain ms/pass | idle ms/pass | idle/plain | spread | plain ms/token | default ms/token | "
          "speedup | spread | default drafted | prefill ms (plain, idle, default) | same (idle, default) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        plain, idle, default = (runs[arm] for arm in ARMS)
        drafted = sum(r["drafted"] for r in default) / max(sum(r["passes"] - 1 for r in default), 1)
        print(f"| {name} | {per_pass(plain):.2f} | {per_pass(idle):.2f} | {per_pass(idle) / per_pass(plain):.3f} | "
              f"{spread(runs, args, 'idle', per_pass)} | {per_token(plain):.2f} | {per_token(default):.2f} | "
              f"{per_token(plain) / per_token(default):.3f} | {spread(runs, args, 'default', per_token)} | "
              f"{drafted:.0%} | {prefill(plain):.0f}, {prefill(idle):.0f}, {prefill(default):.0f} | "
              f"{same_tokens(runs, args.sampling == 'greedy')} |")
    print("\nThe idle arm's extra CPU us per decode pass: measured parts (policy: next_gamma, timed, _report; outcome:"
          " the loop's feature rows; features: a one-token pass with the drafter's features minus one without); rest"
          " = idle - plain - those (the loop's other work and noise); begin and end: per request, shown per pass")
    columns = (*Meter.PARTS, "features", "features +-", "rest", "extra")
    print("| drafter | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for name, runs in results.items():
        parts = split(runs)
        print(f"| {name} | " + " | ".join(f"{parts[c]:.0f}" for c in columns) + " |")
    print(f"\nThe default arm's passes by the policy's kind (cold: before c was known; probe; chosen: a length it "
          f"predicted to pay); cost in the same request's plain passes (median CPU of its plain decode passes); net = "
          f"tokens - cost, in plain passes (> 0: the kind won time). The idle arm's policy: c = {NEVER_PAYS_C:g}.")
    print(PassKinds.HEADER)
    for name, runs in results.items():
        for row in probe_table(name, [r["log"] for r in runs["default"]]):
            print(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--drafters", default=None, help="comma-separated; default: every registered family")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--sampling", choices=tuple(SAMPLING), default="greedy")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="cpu: process_time (one thread only)")
    parser.add_argument("--feature-passes", type=int, default=100)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts = pick_prompts(target.tokenizer, args.prompts)
    names = args.drafters.split(",") if args.drafters else sf.list_drafters()
    meter = Meter(make_clock(args.clock))
    instrument_loop(meter)
    print(f"target {args.target}, matmul {target.matmul}, torch {torch.__version__}, prompt lengths "
          f"{[len(p) for p in prompts]}, wrapper overhead {1e6 * meter.overhead():.2f} us a wrapped call", flush=True)
    results = {}
    for name in names:
        started = time.perf_counter()
        try:
            results[name] = family(meter, target, name, prompts, args)
        except Exception as err:  # a family that cannot run here (no weights for this target) is reported, not fatal
            print(f"{name}: skipped ({type(err).__name__}: {err})", flush=True)
            continue
        print(f"{name}: done in {time.perf_counter() - started:.0f} s wall", flush=True)
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
