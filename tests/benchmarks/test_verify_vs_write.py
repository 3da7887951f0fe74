"""verify_vs_write's plumbing on a tiny target: the passes leave the cache as it was, the crossing, the table (no
timing claims)."""

from __future__ import annotations

import time

import pytest
import torch

from specfamily.testing import tiny_target


@pytest.fixture
def picture_module(benchmark_module):
    return benchmark_module("verify_vs_write")


def test_passes_feed_each_request_and_leave_the_cache_as_it_was(picture_module):
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float32)
    prompt = [1, 2, 3, 4, 5, 6]
    passes = picture_module.Passes(target, prompt, 3)
    for tokens in (5, 1, 5):
        passes.run(tokens)
        assert passes.engine.cache.lengths[:3] == [len(prompt)] * 3
    point = picture_module.measure(target, prompt, 3, repeats=2, clock=time.perf_counter)
    assert point.batch == 3 and point.verify > 0 and point.write > 0 and point.ratio == point.verify / point.write


def test_the_crossing_and_the_table(picture_module):
    points = [picture_module.Point(1, 0.002, 0.010), picture_module.Point(8, 0.020, 0.019),
              picture_module.Point(16, 0.050, 0.040)]
    picture = picture_module.Picture(1, "cpu", 64, points)
    assert picture.crossing() == 8
    assert picture_module.Picture(1, "cpu", 64, points[:1]).crossing() is None
    rows = picture_module.table(picture).splitlines()[2:4]
    assert rows == ["| 1 | 2.0 | 10.0 | 0.20 |", "| 8 | 20.0 | 19.0 | 1.05 |"]
