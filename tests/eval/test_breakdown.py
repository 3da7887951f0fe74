"""Tau and speedup by category and by turn, from saved records, in report.md and breakdown.csv."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict

import pytest

from specfamily.eval.breakdown import breakdown_rows
from specfamily.eval.report import write_report
from specfamily.eval.results import FailureRecord, PromptRecord, RunInfo, read_records, write_atomic


def _record(drafter, question, turn, category, wall, new_tokens, passes):
    metrics = {"new_tokens": new_tokens, "target_passes": passes, "proposed_tokens": 0, "acceptance_rate": None,
               "draft_acceptance": None, "c": None, "per_position_acceptance": []}
    prompt_id = str(question) if turn == 1 else f"{question}:turn{turn}"
    return PromptRecord(drafter, "spec_bench", "greedy", prompt_id, question, question, None, 5, [1] * new_tokens,
                        wall, False, metrics, category=category, turn=turn)


def _save(folder, records, drafters=("plain", "small_model", "eagle")):
    info = RunInfo(config={"model": {"target": "tiny"}}, seed=0, dataset="spec_bench", sampling="greedy",
                   drafters=list(drafters), prompts=3, max_new_tokens=8, world_size=1, device="cpu", threads=1,
                   versions={}, git=None, verify_cost={}, started="now")
    folder.mkdir(parents=True, exist_ok=True)
    info.save(folder)
    write_atomic(folder / "results.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in records))
    return info


# question 0 (writing) has two turns, question 1 (qa) one; small_model is 2x faster on writing, as fast on qa
RECORDS = [
    _record("plain", 0, 1, "writing", 1.0, 8, 8), _record("small_model", 0, 1, "writing", 0.5, 8, 4),
    _record("plain", 0, 2, "writing", 1.0, 8, 8), _record("small_model", 0, 2, "writing", 0.5, 8, 2),
    _record("plain", 1, 1, "qa", 1.0, 8, 8), _record("small_model", 1, 1, "qa", 1.0, 8, 8),
    FailureRecord("eagle", "create", "FileNotFoundError: no weights"),
]


def test_rows_by_category_and_by_turn(tmp_path):
    info = _save(tmp_path, RECORDS)
    rows = {(r.by, r.group, r.drafter): r for r in breakdown_rows(read_records(tmp_path / "results.jsonl"), info)}
    writing, qa = rows["category", "writing", "small_model"], rows["category", "qa", "small_model"]
    assert (writing.prompts, writing.tau, writing.speedup) == (2, 16 / 6, pytest.approx(2.0))
    assert (qa.prompts, qa.tau, qa.speedup) == (1, 1.0, pytest.approx(1.0))
    overall = rows["category", "overall", "small_model"]
    assert (overall.prompts, overall.tau, overall.speedup) == (3, 24 / 14, pytest.approx(3 / 2))
    assert rows["turn", "2", "small_model"].tau == 4.0 and rows["turn", "1", "small_model"].prompts == 2
    assert rows["category", "qa", "eagle"].prompts == 0
    assert [key for key in rows if key[0] == "category" and key[2] == "plain"] == [
        ("category", g, "plain") for g in ("writing", "qa", "overall")]


def test_report_has_a_table_per_category(tmp_path):
    _save(tmp_path, RECORDS)
    report = write_report(tmp_path, plots=False)
    text = (tmp_path / "report.md").read_text()
    assert (
        "## By category\n\n"
        "| category | prompts | small_model tau | small_model speedup |\n| --- | --- | --- | --- |\n"
        "| writing | 2 | 2.67 | 2.00 |\n| qa | 1 | 1.00 | 1.00 |\n| overall | 3 | 1.71 | 1.50 |\n"
    ) in text
    assert "| turn | prompts | small_model tau | small_model speedup |" in text and "| 2 | 1 | 4.00 | 2.00 |" in text
    assert text.index("## By category") > text.index("| drafter |")  # after the main table
    rows = list(csv.DictReader((tmp_path / "breakdown.csv").open()))
    assert {"by": "category", "group": "qa", "drafter": "plain", "prompts": "1"}.items() <= rows[3].items()
    assert tmp_path / "breakdown.csv" in report.files and len(report.groups) == len(rows) == 9 + 9


def test_records_without_categories_get_no_breakdown(tmp_path):
    plain = [r for r in RECORDS if isinstance(r, PromptRecord) and r.turn == 1]
    _save(tmp_path, [PromptRecord(**{**asdict(r), "category": None}) for r in plain], drafters=("plain", "small_model"))
    report = write_report(tmp_path, plots=False)
    assert report.groups == [] and "## By" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "breakdown.csv").exists()


def test_sweep_gets_one_table_per_run(tmp_path):
    _save(tmp_path / "0", RECORDS)
    _save(tmp_path / "1", RECORDS)
    write_report(tmp_path, plots=False)
    text = (tmp_path / "report.md").read_text()
    assert text.count("run `0`:") == text.count("run `1`:") == 2  # by category and by turn


def test_groups_of_three_or_more_prompts_get_bootstrap_intervals(tmp_path):
    import numpy as np
    from scipy import stats as scipy_stats

    plain_wall, small_wall, passes = [1.0, 2.0, 1.5, 0.8], [0.5, 1.2, 0.6, 0.5], [4, 3, 2, 4]
    records = []
    for q in range(4):
        records += [_record("plain", q, 1, "qa", plain_wall[q], 8, 8),
                    _record("small_model", q, 1, "qa", small_wall[q], 8, passes[q])]
    _save(tmp_path, records, drafters=("plain", "small_model"))
    write_report(tmp_path, plots=False)
    rows = {(r.group, r.drafter): r for r in breakdown_rows(records, RunInfo.load(tmp_path))}
    qa = rows["qa", "small_model"]
    eight = np.full(4, 8.0)
    direct = scipy_stats.bootstrap(
        (eight, small_wall, eight, plain_wall), lambda a, b, c, d, axis=-1: (a.sum(axis) / b.sum(axis)) / (
            c.sum(axis) / d.sum(axis)), paired=True, vectorized=True, n_resamples=2000, method="percentile",
        rng=np.random.default_rng(0)).confidence_interval
    assert (qa.speedup_low, qa.speedup_high) == pytest.approx((direct.low, direct.high))
    assert qa.tau_low < qa.tau == 32 / 13 < qa.tau_high
    assert f"| qa | 4 | 2.46 | {qa.speedup:.2f} ({direct.low:.2f}-{direct.high:.2f}) |" in (
        tmp_path / "report.md").read_text()
    saved = {(r["group"], r["drafter"]): r for r in csv.DictReader((tmp_path / "breakdown.csv").open())}
    assert float(saved["qa", "small_model"]["speedup_low"]) == pytest.approx(direct.low)
