"""The oracle's ceiling: how close the measured oracle row comes to what the target's own pass costs allow.

With a perfect drafter (alpha = 1) at gamma, steady state allows (gamma + 1) t(1) / t(gamma + 1); with the
prompt's prefill, (prefill + (n - 1) t(1)) / (prefill + (ceil(n / (gamma + 1)) - 1) t(gamma + 1)).
"""

from __future__ import annotations

import math
import statistics

import common
from common import PairResult


def oracle_ceiling(setup, results: list[PairResult]) -> dict | None:
    """The oracle's measured speedup over our plain decoding against the ceilings from our target's pass costs; the
    plain decoding timed beside the oracle row when it has one (paired), else the plain row's."""
    by_name = {r.name: r for r in results}
    gamma = setup.args.oracle_gamma
    oracle = by_name.get(f"oracle gamma={gamma}")
    if oracle is None or (not oracle.plain_ms and "plain" not in by_name):
        return None
    plain_ms = oracle.plain_ms or by_name["plain"].ours_ms
    prompt = setup.prompts[0]
    costs = common.pass_costs(setup.target, prompt, [gamma + 1], 10, setup.clock)
    n = setup.max_new_tokens
    steady = (gamma + 1) * costs.t[1] / costs.t[gamma + 1]
    plain_raw = costs.prefill + (n - 1) * costs.t[1]
    oracle_raw = costs.prefill + (math.ceil(n / (gamma + 1)) - 1) * costs.t[gamma + 1]
    speedups = oracle.speedups or [statistics.median(plain_ms) / statistics.median(oracle.ours_ms)]
    measured = statistics.median(speedups)
    end_to_end = plain_raw / oracle_raw
    return {
        "gamma": gamma, "t1_ms": 1000 * costs.t[1], f"t{gamma + 1}_ms": 1000 * costs.t[gamma + 1],
        "prefill_ms": 1000 * costs.prefill, "prompt_length": costs.prompt_length,
        "measured_speedup": measured, "ceiling_steady_state": steady, "ceiling_with_prefill": end_to_end,
        "efficiency": measured / end_to_end, "efficiency_steady_state": measured / steady,
        "plain_floor_ms": 1000 * plain_raw / n,
        "plain_overhead": statistics.median(plain_ms) * n / 1000 / plain_raw,
    }


def oracle_lines(ceiling: dict | None) -> list[str]:
    if ceiling is None:
        return []
    g = ceiling["gamma"]
    return [
        f"Oracle (alpha = 1, gamma = {g}): our loop is {ceiling['measured_speedup']:.2f}x faster than our plain "
        "decoding; the target's pass costs allow (gamma + 1) t(1) / t(gamma + 1) = "
        f"{ceiling['ceiling_steady_state']:.2f}x "
        f"in steady state and {ceiling['ceiling_with_prefill']:.2f}x with this prompt's prefill "
        f"(t(1) = {ceiling['t1_ms']:.2f} ms, t({g + 1}) = {ceiling[f't{g + 1}_ms']:.2f} ms, "
        f"prefill of {ceiling['prompt_length']} tokens = {ceiling['prefill_ms']:.1f} ms).",
        f"Loop efficiency: {100 * ceiling['efficiency']:.0f}% of the ceiling with prefill "
        f"({100 * ceiling['efficiency_steady_state']:.0f}% of the steady-state ceiling). Plain decoding: "
        f"{ceiling['plain_overhead']:.3f}x the time of its target passes ({ceiling['plain_floor_ms']:.2f} ms/token).",
    ]
