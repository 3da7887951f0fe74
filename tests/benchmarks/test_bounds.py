"""benchmarks/bounds.py: the best speedup a measured alpha and c allow, and the alpha a goal needs."""

from __future__ import annotations

import json
import math

import pytest

CURVE = {0: 1.0, 1: 1.2, 2: 1.6, 4: 1.9, 8: 2.5, 12: 3.0}


@pytest.fixture
def bounds(benchmark_module):
    return benchmark_module("bounds")


def test_best_speedup_is_the_theory_maximum_over_chain_lengths(bounds):
    gamma, best = bounds.best_speedup(0.6, 0.05, CURVE)
    assert gamma == 1 and best == pytest.approx((1 + 0.6) / (0.05 + 1.2))  # longer chains pay more than they gain
    flat = {0: 1.0, 12: 1.0}
    assert bounds.best_speedup(0.5, 0.0, flat) == (12, pytest.approx((1 - 0.5**13) / 0.5))


def test_alpha_needed_is_the_smallest_alpha_reaching_the_goal(bounds):
    need = bounds.alpha_needed(1.5, 0.05, CURVE)
    assert bounds.best_speedup(need, 0.05, CURVE)[1] >= 1.5 > bounds.best_speedup(need - 0.002, 0.05, CURVE)[1]
    assert math.isnan(bounds.alpha_needed(5.0, 0.05, CURVE))  # more than 13 tokens' worth per 3x pass


def test_a_run_folder_gives_one_row_per_drafter(bounds, tmp_path, capsys):
    header = "drafter,gamma,tau,alpha,c,speedup,verify_cost\n"
    rows = "plain,,1.0,,,1.0,1.0\neagle,2,1.3,0.4,0.05,1.1,1.6\nself_spec,1,1.0,nan,nan,1.0,1.0\n"
    (tmp_path / "summary.csv").write_text(header + rows)
    (tmp_path / "run.json").write_text(json.dumps({"verify_cost": {str(g): v for g, v in CURVE.items()}}))
    assert bounds.main([str(tmp_path), "--goal", "eagle=1.8", "--out", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "| eagle | 1.30 | 0.40 | 0.080 | 1.10 |" in out and "| 1.80x |" in out and "self_spec" not in out
    row = json.loads((tmp_path / "b.json").read_text())["rows"][0]
    assert row["c"] == pytest.approx(0.05 * 1.6) and row["alpha_needed"] == pytest.approx(
        bounds.alpha_needed(1.8, 0.08, CURVE))


def test_a_folder_without_a_summary_is_refused(bounds, tmp_path):
    with pytest.raises(SystemExit, match="has no summary.csv: pass a finished run's folder"):
        bounds.main([str(tmp_path)])
