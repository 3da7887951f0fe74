"""The run's noise checks: plain repeats and verify-cost rounds, flagged on noisy timings and not on steady ones."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from omegaconf import OmegaConf

from specfamily.eval.noise import (
    NoiseSettings,
    describe,
    noise_checks,
    plain_repeat_check,
    record_noise,
    relative_spread,
    repeat_schedule,
    verify_cost_check,
)
from specfamily.eval.report import write_report
from specfamily.eval.results import PromptRecord, RepeatRecord, RunInfo, write_atomic

TOKENS = [5] * 32


def _plain(prompt_id: str, wall: float, rank: int = 0) -> PromptRecord:
    metrics = {"new_tokens": len(TOKENS), "target_passes": len(TOKENS), "proposed_tokens": 0, "acceptance_rate": None,
               "draft_acceptance": None, "c": None, "per_position_acceptance": []}
    return PromptRecord("plain", "set", "greedy", prompt_id, 0, 0, None, 7, list(TOKENS), wall, False, metrics,
                        rank=rank)


def _repeats(walls: list[float], prompt_id: str = "p0", rank: int = 0) -> list[RepeatRecord]:
    return [RepeatRecord(prompt_id, 0, k, 4 * k, list(TOKENS), wall, rank) for k, wall in enumerate(walls, 1)]


def test_schedule_spreads_repeats_over_the_run_and_ends_at_the_last_prompt():
    assert repeat_schedule(13, 3) == {4: 1, 8: 2, 12: 3}
    assert repeat_schedule(3, 3) == {0: 1, 1: 2, 2: 3}
    assert repeat_schedule(2, 3) == {0: 1, 1: 2}  # never two repeats back to back at one point
    assert repeat_schedule(5, 0) == {} and repeat_schedule(0, 3) == {}


def test_relative_spread():
    assert relative_spread([1.0, 1.1, 0.9, 1.0]) == pytest.approx(0.2)
    assert math.isnan(relative_spread([1.0])) and math.isnan(relative_spread([]))


def test_steady_plain_repeats_pass_and_noisy_ones_are_flagged():
    steady = plain_repeat_check([_plain("p0", 1.00)], _repeats([1.02, 0.99, 1.01]), threshold=0.10)
    assert not steady.unstable and steady.spread == pytest.approx(0.03 / 1.005) and steady.samples == 4
    assert "3 of 3 repeat(s) gave the same tokens" in steady.detail
    # a second job came and went: one repeat ran 30% slower
    noisy = plain_repeat_check([_plain("p0", 1.00)], _repeats([1.01, 1.30, 0.98]), threshold=0.10)
    assert noisy.unstable and noisy.spread == pytest.approx(0.32 / 1.005)
    assert describe(noisy).startswith("unstable: plain repeats differ by 31.8% (> the 10% threshold)")
    assert describe(steady).startswith("stable: plain repeats differ by 3.0% (<= the 10% threshold)")


def test_the_worst_rank_decides_and_no_repeats_is_not_measured():
    records = [_plain("p0", 1.0), _plain("p1", 1.0, rank=1)]
    check = plain_repeat_check(records, _repeats([1.0, 1.0]) + _repeats([1.0, 1.5], "p1", rank=1), 0.10)
    assert check.unstable and check.spread == pytest.approx(0.5) and "prompt `p1` on rank 1" in check.detail
    missing = plain_repeat_check(records, [], 0.10)
    assert missing.spread is None and not missing.unstable and "not measured" in describe(missing)


def test_verify_cost_rounds():
    steady = [{"0": 0.010, "4": 0.020, "8": 0.030}, {"0": 0.0102, "4": 0.0199, "8": 0.0303},
              {"0": 0.0099, "4": 0.0201, "8": 0.0298}]
    check = verify_cost_check(steady, threshold=0.10)
    assert not check.unstable and check.spread == pytest.approx(0.0005 / 0.03)  # the median of 3%, 1% and 1.67%
    noisy = [dict(steady[0]), {g: s * 1.4 for g, s in steady[1].items()}, dict(steady[2])]  # one slow round
    assert verify_cost_check(noisy, threshold=0.10).unstable
    assert verify_cost_check(steady[:1], 0.10).spread is None


def test_settings_from_config_and_bad_values():
    assert NoiseSettings.from_config(None) == NoiseSettings(3, 3, 0.10)
    assert NoiseSettings.from_config(OmegaConf.create({"repeats": 0, "threshold": 0.2})) == NoiseSettings(0, 3, 0.2)
    with pytest.raises(TypeError, match="unknown key"):
        NoiseSettings.from_config({"repeat": 2})
    with pytest.raises(ValueError, match="noise.threshold must be a number > 0"):
        NoiseSettings(threshold=0)
    with pytest.raises(ValueError, match="noise.cost_rounds must be an integer >= 1"):
        NoiseSettings(cost_rounds=0)


def _save(folder, walls, threshold=None):
    config = {"model": {"target": "tiny"}, **({"noise": {"threshold": threshold}} if threshold else {})}
    info = RunInfo(config=config, seed=0, dataset="set", sampling="greedy", drafters=["plain"], prompts=1,
                   max_new_tokens=32, world_size=1, device="cpu", threads=1, versions={}, git=None, verify_cost={},
                   started="now", pass_seconds=[{"0": 0.01}, {"0": 0.0101}])
    folder.mkdir(parents=True, exist_ok=True)
    info.save(folder)
    write_atomic(folder / "results.jsonl", json.dumps(asdict(_plain("p0", walls[0]))) + "\n")
    write_atomic(folder / "repeats.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in _repeats(walls[1:])))


def test_noisy_run_is_flagged_in_run_json_and_the_report(tmp_path):
    _save(tmp_path, [1.0, 1.0, 1.25, 1.0])
    info = record_noise(tmp_path)
    saved = json.loads((tmp_path / "run.json").read_text())["noise"]
    assert [(c["name"], c["unstable"]) for c in saved] == [("plain_repeats", True), ("verify_cost", False)]
    assert saved[0]["threshold"] == 0.10 and saved[0]["spread"] == pytest.approx(0.25)
    assert RunInfo.load(tmp_path).unstable and info.unstable
    write_report(tmp_path, plots=False)
    report = (tmp_path / "report.md").read_text()
    assert "> **Unstable timings**: plain repeats differ by 25.0% (> the 10% threshold)" in report
    assert "## Noise\n" in report and "stable: verify-cost rounds differ by 1.0%" in report


def test_steady_run_is_not_flagged_and_the_threshold_is_the_runs_own(tmp_path):
    _save(tmp_path / "steady", [1.0, 1.02, 0.99, 1.01])
    assert not record_noise(tmp_path / "steady").unstable
    assert "Unstable" not in write_report(tmp_path / "steady", plots=False).table
    assert "Unstable" not in (tmp_path / "steady" / "report.md").read_text()
    _save(tmp_path / "lenient", [1.0, 1.0, 1.25, 1.0], threshold=0.3)  # noise.threshold=0.3 in the run's config
    checks = noise_checks([_plain("p0", 1.0)], _repeats([1.0, 1.25, 1.0]), RunInfo.load(tmp_path / "lenient"))
    assert checks[0].threshold == 0.3 and not checks[0].unstable
