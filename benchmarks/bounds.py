"""What bounds each drafter's speedup: its measured alpha and c against the target's verify cost, from a run's summary.

For every drafter row of a comparison run (``specfamily`` writes ``summary.csv`` and ``run.json``) it prints the
measured alpha, c and speedup, the best speedup any draft length could give at that alpha and c under the run's own
verify-cost curve (Leviathan et al.'s i.i.d. model, ``sf.theory.expected_speedup``; for trees an approximation), the
same with a free drafter (c = 0: the verify cost alone), and the alpha a goal speedup would need at the measured c.

    python benchmarks/bounds.py runs/2026-12-01_10-30-00 --goal eagle=1.8 --goal medusa=1.4 --goal small_model=1.4
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

MAX_GAMMA = 12


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run folder holding summary.csv and run.json")
    parser.add_argument("--goal", action="append", default=[], metavar="DRAFTER=SPEEDUP",
                        help="a goal speedup over plain decoding; the alpha it needs is printed")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    return parser.parse_args(argv)


def load(folder: Path) -> tuple[list[dict], dict[int, float]]:
    """(summary rows, verify-cost curve g -> t(g + 1) / t(1)) of a run folder."""
    for name in ("summary.csv", "run.json"):
        if not (folder / name).is_file():
            raise SystemExit(f"{folder} has no {name}: pass a finished run's folder")
    with (folder / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    curve = {int(g): float(v) for g, v in json.loads((folder / "run.json").read_text())["verify_cost"].items()}
    if not curve:
        raise SystemExit(f"{folder}/run.json has no verify-cost curve (the run did not measure it)")
    return rows, curve


def best_speedup(alpha: float, c: float, curve: dict[int, float]) -> tuple[int, float]:
    """(gamma, expected speedup) of the best chain length in 1..MAX_GAMMA at this alpha and c (c per draft step,
    relative to a one-token pass)."""
    from specfamily.core.costs import verify_cost_at
    from specfamily.core.theory import expected_speedup

    options = [(g, expected_speedup(alpha, g, c, verify_cost_at(curve, g))) for g in range(1, MAX_GAMMA + 1)]
    return max(options, key=lambda option: option[1])


def alpha_needed(goal: float, c: float, curve: dict[int, float]) -> float:
    """The smallest alpha (to 0.001) whose best chain reaches ``goal``; nan when even alpha = 1 does not."""
    if best_speedup(1.0, c, curve)[1] < goal:
        return math.nan
    low, high = 0.0, 1.0
    while high - low > 1e-3:
        mid = (low + high) / 2
        low, high = (low, mid) if best_speedup(mid, c, curve)[1] >= goal else (mid, high)
    return high


def bound_rows(rows: list[dict], curve: dict[int, float], goals: dict[str, float]) -> list[dict]:
    out = []
    for row in rows:
        name, alpha, c = row["drafter"], _float(row["alpha"]), _float(row["c"])
        if name == "plain" or not math.isfinite(alpha) or not math.isfinite(c):
            continue
        c_step = c * _float(row["verify_cost"], 1.0)  # c is per verification pass; rescaled to a one-token pass
        gamma, best = best_speedup(alpha, c_step, curve)
        goal = goals.get(name.split(" ")[0])
        out.append({
            "drafter": name, "tau": _float(row["tau"]), "alpha": alpha, "c": c_step, "speedup": _float(row["speedup"]),
            "best_gamma": gamma, "best_speedup": best, "free_drafter_speedup": best_speedup(alpha, 0.0, curve)[1],
            "goal": goal, "alpha_needed": alpha_needed(goal, c_step, curve) if goal else math.nan,
        })
    return out


def markdown(rows: list[dict], curve: dict[int, float]) -> str:
    costs = ", ".join(f"{g}: {v:.2f}" for g, v in sorted(curve.items()))
    lines = [f"verify cost t(g+1)/t(1): {costs}", "",
             "| drafter | tau | alpha | c | speedup | best chain at this alpha, c | with c = 0 | goal | alpha needed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        goal = f"{r['goal']:.2f}x" if r["goal"] else "-"
        need = f"{r['alpha_needed']:.2f}" if math.isfinite(r["alpha_needed"]) else "unreachable"
        need = need if r["goal"] else "-"
        lines.append(f"| {r['drafter']} | {r['tau']:.2f} | {r['alpha']:.2f} | {r['c']:.3f} | {r['speedup']:.2f} | "
                     f"{r['best_speedup']:.2f} (gamma {r['best_gamma']}) | {r['free_drafter_speedup']:.2f} | {goal} | "
                     f"{need} |")
    return "\n".join(lines)


def _float(text: str, default: float = math.nan) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return default


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    goals = {}
    for item in args.goal:
        name, _, value = item.partition("=")
        if not value:
            raise SystemExit(f"--goal takes DRAFTER=SPEEDUP, got {item!r}")
        goals[name] = float(value)
    rows, curve = load(Path(args.run))
    table = bound_rows(rows, curve, goals)
    print(markdown(table, curve))
    if args.out:
        Path(args.out).write_text(json.dumps({"run": args.run, "verify_cost": curve, "rows": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
