"""gpu_batch's plumbing on the CPU with a tiny random shape: the picture's rows, the peer's identity (no timing)."""

from __future__ import annotations

import json
import sys

import pytest

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            vocab_size=96, rope_theta=10000.0)


@pytest.fixture
def gpu_batch(benchmark_module, monkeypatch):
    module = benchmark_module("gpu_batch")
    monkeypatch.setitem(sys.modules["gpu_shapes"].SHAPES, "tiny", TINY)
    return module


def test_a_dry_run_records_the_picture_and_the_peer_per_batch_size(gpu_batch, tmp_path):
    out = tmp_path / "batch.json"
    gpu_batch.main(["--device", "cpu", "--shapes", "tiny", "--dtype", "float64", "--batches", "1,3",
                    "--peer-batches", "1,3", "--tokens", "5", "--context", "12", "--repeats", "2", "--out", str(out)])
    (record,) = json.loads(out.read_text())["records"]
    assert record["shape"] == "tiny" and record["device"] == "cpu" and record["dtype"] == "float64"
    assert set(record["picture"]) == {"1", "3"}
    assert all(row["t1_ms"] > 0 and row["ratio"] == pytest.approx(row["t5_ms"] / row["t1_ms"], rel=1e-2)
               for row in record["picture"].values())
    assert set(record["peer"]) == {"1", "3"}
    assert [record["peer"][b]["transformers_identical"] for b in ("1", "3")] == ["1/1", "3/3"]  # float64: no flip
    assert all(v > 0 for b in ("1", "3") for v in record["peer"][b]["tokens_per_s"].values())
