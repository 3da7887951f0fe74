"""benchmarks/suffix.py's plumbing on a tiny random target: interleaved arms, identity checks, warm caches, rows."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from specfamily.testing import tiny_target

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sys.modules.pop("suffix", None)
    yield importlib.import_module("suffix")
    sys.modules.pop("suffix", None)


def _items(bench, count=3):
    gen = torch.Generator().manual_seed(0)
    items = []
    for i in range(count):
        base = torch.randint(0, 32, (4,), generator=gen).tolist()
        items.append(bench.Item("ab"[i % 2], base * 3))
    return items


def test_arms_are_interleaved_identical_and_summarised(bench):
    target = tiny_target("llama", vocab_size=32)
    arms = {name: bench.make_drafter(target, name, 4) for name in ("plain", "prompt_lookup", "suffix", "suffix:chain")}
    assert arms["suffix"].config.max_tree_size == 4 and arms["suffix:chain"].config.mode == "chain"
    results = bench.run_workload(target, arms, _items(bench), max_new_tokens=12)
    rows = bench.summary_rows(results)
    assert [(r["arm"], r["category"]) for r in rows[:3]] == [("plain", "all"), ("plain", "a"), ("plain", "b")]
    assert all(r["identical"] for r in rows) and all(r["tokens"] == 36 for r in rows if r["category"] == "all")
    plain, suffix = rows[0], next(r for r in rows if r["arm"] == "suffix" and r["category"] == "all")
    assert plain["tau"] == 1.0 and plain["speedup"] == 1.0 and plain["proposed"] == 0
    assert suffix["proposed"] > 0 and suffix["tau"] > 1.0
    assert "| suffix | all |" in bench.markdown("t", rows)
    memory = bench.cache_memory(arms["suffix"])
    assert memory["tokens"] == 36 and memory["states"] > 0 and memory["mb_per_1k_tokens"] > 0


def test_warm_cache_is_saved_and_loaded(bench, tmp_path):
    target = tiny_target("llama", vocab_size=32)
    items = _items(bench, 2)
    path = bench.warm_cache(target, items, 8, tmp_path / "warm.safetensors", 3)
    warm = bench.make_drafter(target, "suffix", 3, {"cache": str(path)})
    assert warm.global_cache.tokens == 16
    with pytest.raises(ValueError, match="first arm must be plain"):
        bench.run_workload(target, {"suffix": warm}, items, 4)
