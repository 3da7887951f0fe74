"""``sf.load_run``: a run's rows (prompt, text, tokens, metrics) as a ``datasets.Dataset``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest
from eval_helpers import chat_overrides
from transformers import AutoTokenizer

import specfamily as sf
from specfamily.eval.results import FailureRecord, PromptRecord, RunInfo, read_records, write_atomic
from specfamily.eval.runner import run_experiment


def test_load_run_is_public_and_lazy():
    assert "load_run" in sf.__all__ and "load_run" in dir(sf)
    from specfamily.eval.table import load_run

    assert sf.load_run is load_run
    code = "import sys, specfamily as sf; sf.load_run; print(sorted({'datasets', 'scipy', 'torch'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"  # naming sf.load_run imports neither datasets, scipy nor torch


def test_load_run_of_a_finished_chat_run(chat_pair, compose_config, tmp_path):
    run_experiment(compose_config(chat_overrides(chat_pair)), tmp_path)
    records = read_records(tmp_path / "results.jsonl")
    table = sf.load_run(tmp_path)
    assert table.num_rows == len(records) == 6
    assert table["drafter"] == [r.drafter for r in records] and table["prompt_id"] == [r.prompt_id for r in records]
    assert table["tokens"] == [r.tokens for r in records] and table["category"] == [r.category for r in records]
    assert table["turn"] == [1, 1, 2, 2, 1, 1] and set(table["run"]) == {"."}
    tokenizer = AutoTokenizer.from_pretrained(chat_pair["target"])
    assert table["text"] == [tokenizer.decode(r.tokens) for r in records]
    assert table[0]["prompt"] == "<|user|>Write a line.<|end|>\n<|assistant|>"
    assert table[2]["prompt"].endswith("<|user|>Now shorter.<|end|>\n<|assistant|>")
    # metrics flattened into their own columns, under Metrics' names
    assert table["new_tokens"] == [r.metrics["new_tokens"] for r in records]
    assert table["mean_accepted_length"] == pytest.approx([r.metrics["mean_accepted_length"] for r in records])
    assert table["per_position_acceptance"][1] == pytest.approx(records[1].metrics["per_position_acceptance"])
    assert "metrics" not in table.column_names and "metric_lossy" not in table.column_names
    assert table.features["gamma"].dtype == "int64" and table.features["acceptance_rate"].dtype == "float64"
    assert table[0]["gamma"] is None and table[0]["acceptance_rate"] is None  # plain decoding: no draft, no alpha
    # the draft model is the target itself: greedy text identical to plain decoding on every turn
    assert table["identical_to_plain"] == [True] * 6
    plain, small = records[0], records[1]
    expected = (small.metrics["new_tokens"] / small.wall_seconds) / (plain.metrics["new_tokens"] / plain.wall_seconds)
    assert table[1]["speedup"] == pytest.approx(expected) and table[0]["speedup"] == pytest.approx(1.0)
    frame = table.to_pandas()
    assert list(frame.columns) == table.column_names and len(frame) == 6
    sums = {label: sum(r.metrics["new_tokens"] for r in records if r.drafter == label)
            for label in ("plain", "small_model")}
    assert frame.groupby("drafter")["new_tokens"].sum().to_dict() == sums


def _record(drafter, prompt, tokens, wall):
    metrics = {"new_tokens": len(tokens), "target_passes": len(tokens), "acceptance_rate": None, "c": None,
               "per_position_acceptance": [], "lossy": False, "draft_seconds": 0.0}
    return PromptRecord(drafter, "set", "greedy", f"p{prompt}", prompt, prompt, None, 3, tokens, wall, False, metrics,
                        prompt="question", text="answer")


def _save(folder, records):
    info = RunInfo(config={}, seed=0, dataset="set", sampling="greedy", drafters=["plain", "small_model"], prompts=1,
                   max_new_tokens=4, world_size=1, device="cpu", threads=1, versions={}, git=None, verify_cost={},
                   started="now")
    folder.mkdir(parents=True)
    info.save(folder)
    write_atomic(folder / "results.jsonl", "".join(json.dumps(asdict(r)) + "\n" for r in records))


def test_a_sweep_folder_gives_every_runs_rows_and_failures_are_not_rows(tmp_path):
    _save(tmp_path / "0", [_record("plain", 0, [1, 2], 1.0), _record("small_model", 0, [1, 3], 0.5)])
    _save(tmp_path / "1", [_record("plain", 0, [1, 2], 1.0), FailureRecord("small_model", "create", "OSError: x")])
    table = sf.load_run(tmp_path)
    assert list(zip(table["run"], table["drafter"], strict=True)) == [("0", "plain"), ("0", "small_model"),
                                                                      ("1", "plain")]
    assert table["identical_to_plain"] == [True, False, True] and table["speedup"] == pytest.approx([1.0, 2.0, 1.0])
    assert table["prompt"] == ["question"] * 3 and table["draft_seconds"] == [0.0] * 3


def test_an_empty_run_has_the_columns_and_no_rows(tmp_path):
    _save(tmp_path / "run", [])
    table = sf.load_run(tmp_path / "run")
    assert table.num_rows == 0 and {"prompt", "text", "tokens", "new_tokens", "speedup"} <= set(table.column_names)


def test_a_folder_without_a_run_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run.json under"):
        sf.load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        sf.load_run(tmp_path / "missing")
