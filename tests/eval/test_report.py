"""Reports rebuilt from saved results: the numbers, the CSV, the Markdown, sweeps, ``specfamily-report``."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict

import pytest

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


def _save_run(folder, gamma=2, small_wall=0.5):
    info = RunInfo(config={"model": {"target": "tiny"}, "seed": 0}, seed=0, dataset="set", sampling="greedy",
                   drafters=["plain", "small_model", "eagle"], prompts=2, max_new_tokens=10, world_size=1,
                   device="cpu", threads=1, versions={"specfamily": "0.1.0"}, git=None,
                   verify_cost={"0": 1.0, "2": 1.2, "4": 1.4}, started="now")
    folder.mkdir(parents=True, exist_ok=True)
    info.save(folder)
    records = [
        _record("plain", 0, None, 1.0, _metrics(10, 10, 0, 0, None, None, [])),
        _record("small_model", 0, gamma, small_wall, _metrics(10, 5, 8, 5, 0.8, 0.1, [0.9, 0.7])),
        _record("plain", 1, None, 1.0, _metrics(10, 10, 0, 0, None, None, [])),
        _record("small_model", 1, gamma, small_wall, _metrics(10, 5, 8, 5, 0.6, 0.3, [0.7, 0.5])),
        FailureRecord("eagle", "create", "FileNotFoundError: zoo model 'zoo:code-eagle' is not shipped"),
    ]
    write_atomic(folder / "results.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in records))


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
    assert (rows["plain"]["tau"], rows["plain"]["speedup"], rows["plain"]["status"]) == ("1.0", "1.0", "ok")
    assert rows["eagle"]["status"] == "failed" and rows["eagle"]["prompts"] == "0"
    assert f"| small_model | 2 | ok | 2 | 2.00 | 0.70 | 2.00 | {expected:.2f} | 0.20 | 1.20 | no |" in table
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
