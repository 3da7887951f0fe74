"""benchmarks/pass_rest.py on the shipped code target: every arm booked item by item, not its numbers."""

from __future__ import annotations

import pytest
import torch

from specfamily.runtime.native_layers import native_build


@pytest.fixture
def pass_rest(benchmark_module):
    return benchmark_module("pass_rest")


def test_ops_are_booked_to_their_items(pass_rest):
    assert pass_rest.item("specfamily::product") == "products (layers)"
    assert pass_rest.item("pass::head") == "products (head)"
    assert pass_rest.item("aten::silu_") == "silu, mul, add" and pass_rest.item("aten::add_") == "silu, mul, add"
    assert pass_rest.item("aten::empty_strided") == "views, allocations"
    assert pass_rest.item("aten::as_strided") == "views, allocations"
    assert pass_rest.item("aten::eq") == "mask -> visible"
    assert pass_rest.item("aten::sort") == "other ops"


@pytest.mark.skipif(native_build().module is None, reason="the C++ layer loop does not build here")
def test_every_arm_is_booked_with_the_layer_loops_named_products(pass_rest, capsys):
    results = pass_rest.main(["--model", "zoo:code-target", "--lengths", "40", "--passes", "2", "--threads", "1"])
    by_kind = results[40]
    assert set(by_kind) == set(pass_rest.KINDS)
    for items in by_kind.values():
        # named by native_layers.cpp (0 without its RECORD_FUNCTION): the products, norms and rope in C++
        assert items["products (layers)"] > 0 and items["norms"] > 0 and items["rope + cache write"] > 0
        assert items["products (head)"] > 0 and items[pass_rest.ALONE] > 0 and items["total"] > 0
    # drafted passes take the kernel's visibility from their layout (no mask read back); the tree's commit copies
    assert all(items.get("mask -> visible", 0.0) == 0 for items in by_kind.values())
    assert by_kind["tree"]["copies"] > 0 and by_kind["plain"].get("copies", 0.0) == 0
    printed = capsys.readouterr().out
    assert "cache 40: ms per pass (profiler, medians over passes)" in printed and "| total |" in printed


def test_the_base_arm_can_pick_greedy_tokens_by_max_indices(pass_rest, monkeypatch):
    from specfamily.core import sampling

    calls = []
    monkeypatch.setattr(sampling, "greedy_rows", lambda logits: calls.append(logits.shape))
    logits = torch.randn(3, 50)
    with pass_rest.max_indices(True):
        assert torch.equal(sampling.greedy_tokens(logits), logits.max(-1).indices) and calls == []
    with pass_rest.max_indices(False):
        sampling.greedy_tokens(logits)
    assert calls == [(3, 50)]
    sampling.greedy_tokens(logits)
    assert calls == [(3, 50), (3, 50)]  # restored after the base's passes
