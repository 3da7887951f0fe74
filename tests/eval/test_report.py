"""Reports rebuilt from saved results: the numbers, the CSV, the Markdown, sweeps, ``specfamily-report``."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as scipy_stats

from specfamily.core import theory
from specfamily.eval.report import main, write_report
from specfamily.eval.results import FailureRecord, PromptRecord, RunInfo, write_atomic


def _metrics(new_tokens, passes, proposed, accepted, alpha, c, per_position):
    return {"new_tokens": new_tokens, "target_passes": passes, "draft_steps": proposed, "proposed_tokens": proposed,
            "accepted_tokens": accepted, "acceptance_rate": alpha, "draft_acceptance": accepted / proposed if proposed
            else None, "mean_accepted_length": new_tokens / passes, "per_position_acceptance": per_position,
            "draft_seconds": 0.0, "verify_seconds": 0.0, "other_seconds": 0.0, "total_seconds": 0.0, "c": c,
            "lossy": False}


def _record(drafter, prompt, gamma, wall, metrics):
    return PromptRecord(drafter, "set", "greedy", f"p{prompt}", prompt, prompt, gamma, 7, [1] * metrics["new_tokens"],
                        wall, False, metrics)


def _info(prompts=2, sampling="greedy"):
    return RunInfo(config={"model": {"target": "tiny"}, "seed": 0}, seed=0, dataset="set", sampling=sampling,
                   drafters=["plain", "small_model", "eagle"], prompts=prompts, max_new_tokens=10, world_size=1,
                   device="cpu", threads=1, versions={"specfamily": "0.1.0"}, git=None,
                   verify_cost={"0": 1.0, "2": 1.2, "4": 1.4}, started="now")


def _write(folder, info, records):
    folder.mkdir(parents=True, exist_ok=True)
    info.save(folder)
    write_atomic(folder / "results.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in records))


def _save_run(folder, gamma=2, small_wall=0.5):
    records = [
        _record("plain", 0, None, 1.0, _metrics(10, 10, 0, 0, None, None, [])),
        _record("small_model", 0, gamma, small_wall,
                {**_metrics(10, 5, 8, 5, 0.8, 0.1, [0.9, 0.7]), "conditional_acceptance": [0.9, 0.8]}),
        _record("plain", 1, None, 1.0, _metrics(10, 10, 0, 0, None, None, [])),
        _record("small_model", 1, gamma, small_wall, _metrics(10, 5, 8, 5, 0.6, 0.3, [0.7, 0.5])),
        FailureRecord("eagle", "create", "FileNotFoundError: zoo model 'zoo:code-eagle' is not shipped"),
    ]
    _write(folder, _info(), records)


def test_report_from_saved_results(tmp_path, capsys):
    _save_run(tmp_path)
    assert main([str(tmp_path), "--no-plots"]) == 0
    table = capsys.readouterr().out
    rows = {row["drafter"]: row for row in csv.DictReader((tmp_path / "summary.csv").open())}
    small = rows["small_model"]
    assert float(small["tau"]) == 2.0
    assert float(small["alpha"]) == pytest.approx(0.7)
    assert float(small["c"]) == pytest.approx(0.2)
    assert float(small["speedup"]) == pytest.approx(2.0)  # half the time for the same tokens
    assert float(small["draft_tokens_per_pass"]) == 2.0 and float(small["verify_cost"]) == pytest.approx(1.2)
    expected = theory.expected_speedup(0.7, 2, 0.2 * 1.2, verify_cost=1.2)
    assert float(small["predicted_speedup"]) == pytest.approx(expected)
    assert json.loads(small["per_position"]) == pytest.approx([0.8, 0.6])
    assert json.loads(small["conditional"]) == pytest.approx([0.9, 0.8])  # the one prompt that recorded it
    assert (rows["plain"]["tau"], rows["plain"]["speedup"], rows["plain"]["status"]) == ("1.0", "1.0", "ok")
    assert rows["eagle"]["status"] == "failed" and rows["eagle"]["prompts"] == "0"
    row = f"| small_model | 2 | ok | 2 | 2.00 | - | - | 0.70 | 2.00 | - | {expected:.2f} | 2/2 | 0.20 | 1.20 | no |"
    assert row in table  # two prompts: too few for an interval
    report = (tmp_path / "report.md").read_text()
    assert "- `eagle`: create: FileNotFoundError: zoo model 'zoo:code-eagle' is not shipped" in report
    assert "verify cost t(g+1)/t(1) by draft tokens g: 0: 1.00, 2: 1.20, 4: 1.40" in report


def test_partial_run_is_marked_partial(tmp_path):
    _save_run(tmp_path)
    lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "results.jsonl").write_text("".join(lines[:3]))
    rows = {row.drafter: row for row in write_report(tmp_path, plots=False).rows}
    assert rows["small_model"].status == "partial" and rows["small_model"].prompts == 1
    assert rows["small_model"].speedup == pytest.approx(2.0)  # over the prompt both finished


def test_sweep_folder_gets_one_combined_report(tmp_path):
    _save_run(tmp_path / "0", gamma=2, small_wall=0.5)
    _save_run(tmp_path / "1", gamma=4, small_wall=0.4)
    report = write_report(tmp_path, plots=True)
    small = [row for row in report.rows if row.drafter == "small_model"]
    assert [(row.run, row.gamma) for row in small] == [("0", 2), ("1", 4)]
    assert [row.speedup for row in small] == pytest.approx([2.0, 2.5])
    assert report.table.splitlines()[0].startswith("| run | drafter |")
    assert all(path.is_file() for path in report.files) and len(report.files) == 5


def test_report_of_a_folder_without_runs(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no run.json under" in capsys.readouterr().err


# eight prompts of varied length; small_model differs from plain decoding on prompt 5 only
NEW = [12, 40, 25, 64, 30, 18, 50, 9]
PLAIN_WALL = [0.30, 0.95, 0.60, 1.70, 0.66, 0.50, 1.10, 0.25]
SMALL_WALL = [0.20, 0.40, 0.35, 0.80, 0.50, 0.30, 0.45, 0.22]
PASSES = [6, 15, 11, 20, 14, 9, 16, 5]


def _synthetic(folder, sampling="greedy"):
    records = []
    for i, (new, plain_wall, small_wall, passes) in enumerate(zip(NEW, PLAIN_WALL, SMALL_WALL, PASSES, strict=True)):
        tokens = list(range(new))
        records.append(_record("plain", i, None, plain_wall, _metrics(new, new, 0, 0, None, None, [])))
        small = _record("small_model", i, 3, small_wall, _metrics(new, passes, 30, 20, 0.7, 0.2, [0.8]))
        records[-1].tokens, small.tokens = tokens, tokens if i != 5 else [*tokens[:-1], 999]
        records.append(small)
    _write(folder, _info(len(NEW), sampling), records)


def _ratio_of_sums(a, b, axis=-1):
    return np.sum(a, axis=axis) / np.sum(b, axis=axis)


def _speedup(a, b, c, d, axis=-1):
    return _ratio_of_sums(a, b, axis) / _ratio_of_sums(c, d, axis)


def test_report_columns_identical_share_and_intervals(tmp_path):
    _synthetic(tmp_path)
    report = write_report(tmp_path, plots=False)
    small = next(row for row in report.rows if row.drafter == "small_model")
    new = np.array(NEW, dtype=float)
    assert (small.identical, small.compared) == (7, 8)
    assert small.speedup == pytest.approx(_speedup(new, np.array(SMALL_WALL), new, np.array(PLAIN_WALL)))
    direct = scipy_stats.bootstrap((new, SMALL_WALL, new, PLAIN_WALL), _speedup, paired=True, vectorized=True,
                                   n_resamples=2000, method="percentile", rng=np.random.default_rng(0))
    assert (small.speedup_low, small.speedup_high) == pytest.approx(tuple(direct.confidence_interval))
    index = np.random.default_rng(1).integers(0, len(NEW), (40000, len(NEW)))  # an independent numpy bootstrap
    resampled = _ratio_of_sums(new[index], np.array(PASSES)[index])
    assert (small.tau_low, small.tau_high) == pytest.approx(tuple(np.percentile(resampled, [2.5, 97.5])), rel=0.02)
    assert small.tau == pytest.approx(sum(NEW) / sum(PASSES)) and small.tau_low < small.tau < small.tau_high
    line = next(line for line in report.table.splitlines() if line.startswith("| small_model"))
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[:6] == ["small_model", "3", "ok", "8", f"{small.tau:.2f}", f"{small.tau_low:.2f}-{small.tau_high:.2f}"]
    assert cells[9] == f"{small.speedup_low:.2f}-{small.speedup_high:.2f}" and cells[11] == "7/8"
    assert report.table.splitlines()[0] == (
        "| drafter | gamma | status | prompts | tau | tau 95% CI | drafted | alpha | speedup | speedup 95% CI "
        "| predicted_speedup | identical | c | verify_cost | lossy |")
    plain = next(line for line in report.table.splitlines() if line.startswith("| plain"))
    assert plain == "| plain | - | ok | 8 | 1.00 | 1.00-1.00 | - | - | 1.00 | - | 1.00 | - | - | 1.00 | no |"
    rows = {row["drafter"]: row for row in csv.DictReader((tmp_path / "summary.csv").open())}
    assert float(rows["small_model"]["speedup_low"]) == pytest.approx(small.speedup_low)
    assert (rows["small_model"]["identical"], rows["small_model"]["compared"]) == ("7", "8")


def test_the_report_says_how_often_a_drafter_drafted_and_why_its_policy_did_not(tmp_path):
    from specfamily.eval.report import policy_notes
    from specfamily.eval.summary import drafted_share

    records = [SimpleNamespace(metrics={"drafted_share": share, "target_passes": passes})
               for share, passes in ((0.5, 11), (0.0, 21), (None, 5))]
    assert drafted_share(records) == pytest.approx(5 / 30)  # passes after each prefill; no share: not counted
    _synthetic(tmp_path)
    rows = write_report(tmp_path, plots=False).rows
    small = next(row for row in rows if row.drafter == "small_model")
    small.drafted, small.policy_note = 0.03, "drafted in 3% of passes; predicted gain below 1.02 (best 0.95)"
    assert policy_notes(rows) == (f"## Draft-length policy\n\n- `small_model` (tau {small.tau:.2f}): drafted in 3% "
                                  "of passes; predicted gain below 1.02 (best 0.95)\n")
    small.drafted = 1.0
    assert policy_notes(rows) == ""


def test_identical_share_is_only_reported_for_greedy_runs(tmp_path):
    _synthetic(tmp_path, sampling="t1")
    small = next(row for row in write_report(tmp_path, plots=False).rows if row.drafter == "small_model")
    assert small.identical is None and small.compared == 8


def test_predicted_speedup_uses_the_cost_of_the_passes_the_run_made(tmp_path):
    timed = {"prefill_seconds": 0.1, "verify_seconds": 1.0}  # plain: 9 steady passes of 0.1 s after a 0.1 s prefill
    drafted = {"drafted_passes": 3, "drafted_verify_seconds": 0.36, "drafted_share": 0.75, "prefill_seconds": 0.1}
    records = [
        _record("plain", 0, None, 1.0, {**_metrics(10, 10, 0, 0, None, None, []), **timed}),
        _record("small_model", 0, None, 0.5, {**_metrics(10, 5, 8, 5, 0.8, 0.1, [0.9, 0.7]), **drafted}),
        _record("plain", 1, None, 1.0, {**_metrics(10, 10, 0, 0, None, None, []), **timed}),
        _record("small_model", 1, None, 0.5, {**_metrics(10, 5, 8, 5, 0.6, 0.3, [0.7, 0.5]), **drafted}),
    ]
    _write(tmp_path, _info(), records)
    assert main([str(tmp_path), "--no-plots"]) == 0
    small = {row["drafter"]: row for row in csv.DictReader((tmp_path / "summary.csv").open())}["small_model"]
    assert float(small["verify_cost"]) == pytest.approx(1.2)  # 0.12 s a drafted pass against plain's 0.1 s
    # no fixed gamma: the mean drafted depth, 16 steps over 6 drafted passes, rounds to 3; 3 passes in 4 drafted.
    # The model's tokens a pass on the run's costs: 0.2 s of prefills, then 0.1 s a pass ((1.0 - 0.2) s over 8)
    per_pass_tokens = 0.75 * theory.expected_tokens_per_pass(0.7, 3) + 0.25
    seconds = 0.2 + 0.1 * (20 - 2) / per_pass_tokens
    assert float(small["predicted_speedup"]) == pytest.approx((20 / seconds) / (20 / 2.0))
    assert float(small["speedup"]) == pytest.approx(2.0)
