"""benchmarks/batch_record.py on a tiny target: each steady plan is recorded with the kind it was decided as (the
lengths it fed agree with it) and joined with its pass's measurement (no timing claims)."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.batch_lengths import LengthPolicy
from specfamily.core.batch_plan import BatchPlanning
from specfamily.testing import tiny_target


@pytest.fixture
def batch_record(benchmark_module, monkeypatch):
    for name in ("_plan", "timed", "settle"):  # _install patches these: undone after the test
        monkeypatch.setattr(LengthPolicy, name, getattr(LengthPolicy, name))
    monkeypatch.setattr(BatchPlanning, "_planned", BatchPlanning._planned)
    return benchmark_module("batch_record")


def test_each_plan_is_recorded_as_decided_and_joined_with_its_pass(batch_record):
    batch_record._install()
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 5, 6, 7], [10, 11, 12, 10, 11, 12], [20, 21, 20, 21]] * 2
    sf.generate_batch(target, sf.create_drafter("prompt_lookup", target), prompts, max_new_tokens=24, max_batch=4)
    plans = [r for r in batch_record.RECORDS if "kind" in r]
    assert plans and {r["kind"] for r in plans} <= {"none", "explore", "joint", "pays", "idle", "probe"}
    for r in plans:
        if r["kind"] in ("none", "idle"):
            assert r["N"] == r["B"]  # a plan decided as drafting nothing fed the roots alone
    joined = batch_record.passes(batch_record.RECORDS)
    assert joined and all(p["rows"] >= p["B"] and p["seconds"] > 0 for p in joined)
    assert all(len(p["acceptance"]) == len(p["lengths"]) == len(p["values"]) == p["B"] for p in plans)
    assert all(sum(p["lengths"]) == 0 for p in plans if p["kind"] in ("none", "idle"))
    batch_record.decide()  # each held proposal decided by its request's final text, then the calibration table
    assert set(batch_record.calibrate(batch_record.RECORDS)) == {"passes", "proposals"}
