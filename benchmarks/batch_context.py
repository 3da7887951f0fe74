"""The batched length policy with and without pricing a pass by its slots' contexts, beside constant draft lengths.

Arms, interleaved in one process, ``--repeats`` rounds after one warm-up round (the median kept): ``plain`` (no
drafter), each drafter at ``gamma`` 1 and 2 on every pass (``--gammas``), at its defaults with the passes priced
without their contexts (``unpriced``: the context slopes held at 0, so t(B, N) alone prices a pass, as before session
24) and at its defaults as shipped (``defaults``: ``core/batch_costs.py``). Each default arm keeps its own learned
pass costs and realized windows across its rounds (as a sweep's repeats do), apart from the other arm's. The workload
is ``batch_sweep.py``'s (Spec-Bench first turns, ``--requests-per-slot`` R: R B requests at ``max_batch`` B). Prints
per B and arm: seconds, speedup over plain, target passes over the requests and tau; every arm's tokens are checked
against plain's.

    nice -n 10 python benchmarks/batch_context.py --threads 1 --clock cpu --batch-sizes 4,8 --per-category 1 \\
        --requests-per-slot 2 --max-prompt-tokens 32 --max-new-tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import workload

import specfamily as sf
from specfamily.core import batch_costs


def run_arm(
    target, arm: tuple[str, str, int | None], prompts: list[list[int]], batch: int, budget: int, state: dict, clock
) -> tuple[float, list[list[int]], int]:
    """One run of ``arm`` (label, drafter, gamma): seconds, tokens, target passes over the requests."""
    label, name, gamma = arm
    kept = state.setdefault(label, ({}, {}))
    target.batch_pass_costs, target.batch_realized = kept
    fit = batch_costs.context_slopes
    if label.endswith("unpriced"):
        batch_costs.context_slopes = lambda groups, ridge=0.0: (0.0, 0.0)
    try:
        drafter = (
            None
            if name == "plain"
            else (sf.create_drafter(name, target) if gamma is None else sf.create_drafter(name, target, gamma=gamma))
        )
        start = clock()
        results = sf.generate_batch(target, drafter, prompts, budget, max_batch=batch)
        seconds = clock() - start
    finally:
        batch_costs.context_slopes = fit
    return seconds, [r.tokens for r in results], sum(r.metrics.target_passes for r in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch-sizes", default="4,8")
    parser.add_argument("--drafters", default="prompt_lookup,suffix")
    parser.add_argument("--gammas", default="1,2")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    clock, target, prompts = workload(args)
    gammas = [int(g) for g in args.gammas.split(",") if g]
    arms = [("plain", "plain", None)]
    for name in args.drafters.split(","):
        arms += [(f"{name} g={g}", name, g) for g in gammas]
        arms += [(f"{name} unpriced", name, None), (f"{name} defaults", name, None)]
    print("| B | arm | seconds | speedup | target passes | tau | mismatched |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        chosen, state = prompts[: batch * args.requests_per_slot], {}
        rounds: dict[str, list] = {}
        for repeat in range(args.repeats + 1):  # the first round warms every arm up (not kept)
            for arm in arms:
                out = run_arm(target, arm, chosen, batch, args.max_new_tokens, state, clock)
                if repeat:
                    rounds.setdefault(arm[0], []).append(out)
        plain = statistics.median(r[0] for r in rounds["plain"])
        reference = rounds["plain"][-1][1]
        for label, runs in rounds.items():
            seconds, tokens, passes = statistics.median(r[0] for r in runs), runs[-1][1], runs[-1][2]
            mismatched = sum(a != b for a, b in zip(tokens, reference, strict=True))
            print(
                f"| {batch} | {label} | {seconds:.3f} | {plain / seconds:.3f}x | {passes} | "
                f"{sum(map(len, tokens)) / passes:.3f} | {mismatched} |",
                flush=True,
            )
        for label, (costs, _) in state.items():
            if label.endswith("defaults"):
                k_slot, k_row = batch_costs.RowCosts(passes=costs).slopes
                print(
                    f"{label} at B={batch}: fitted {1e6 * k_slot:.2f} us a slot and {1e6 * k_row:.2f} us a draft "
                    "row per cached token",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
