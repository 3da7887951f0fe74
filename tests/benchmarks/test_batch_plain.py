"""batch_plain's plumbing on a tiny model: the arms decode the same texts, the report's rows (no timing claims)."""

from __future__ import annotations

import pytest

from specfamily.testing import tiny_model


@pytest.fixture
def plain_module(benchmark_module):
    return benchmark_module("batch_plain")


@pytest.mark.parametrize("batch", [1, 3])
def test_every_arm_decodes_transformers_texts_and_is_reported(plain_module, batch):
    model = tiny_model("llama", vocab_size=32, spread=1.0)  # float64: padding cannot flip a near-tie
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]][:batch]
    found = plain_module.arms(model, None, ["exact"], batch, prompts, 5, drafters=("prompt_lookup",))
    assert list(found) == ["hf", "plain/exact"] + (["generate/exact"] if batch == 1 else []) + ["prompt_lookup/exact"]
    times = plain_module.measure(found, rounds=2)
    assert all(len(rounds) == 2 and rounds[0][1] == times["hf"][0][1] for rounds in times.values())
    lines = plain_module.report(batch, times)
    assert lines[1].startswith("| hf | ") and lines[1].endswith("| 1.00x [1.00, 1.00] | 0 |")
    assert all(line.endswith("| 0 |") for line in lines[1:])  # no request's text differs from transformers'
    assert len(lines) == 1 + len(found)
