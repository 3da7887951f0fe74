"""benchmarks/pass_marks.py: its step labels, the marks compiled out of the default builds, and on the shipped code
target every step of every arm timed through a marked build, not its numbers."""

from __future__ import annotations

import pytest

from specfamily.runtime.kernel import stream_kernel
from specfamily.runtime.native_layers import native_build


@pytest.fixture
def pass_marks(benchmark_module):
    return benchmark_module("pass_marks")


def test_a_products_inner_steps_are_named_after_the_layer_step_that_follows(pass_marks):
    marks = [("layer", 0.0), ("norm1", 1.0), ("products", 2.0), ("checks", 4.0), ("region start", 5.0),
             ("region end", 9.0), ("products done", 10.0), ("qkv", 13.0), ("products", 14.0), ("region start", 15.0),
             ("region end", 25.0), ("products done", 26.0)]
    assert pass_marks.labelled(marks) == [
        ("norm1", 1.0), ("qkv: norm1 -> products", 1.0), ("qkv: products -> checks", 2.0),
        ("qkv: checks -> region start", 1.0), ("qkv: region start -> region end", 4.0),
        ("qkv: region end -> products done", 1.0), ("qkv: return", 3.0),
        ("head: qkv -> products", 1.0), ("head: products -> region start", 1.0),
        ("head: region start -> region end", 10.0), ("head: region end -> products done", 1.0)]


@pytest.mark.skipif(stream_kernel().module is None or native_build().module is None,
                    reason="the C++ kernels do not build here")
def test_the_default_builds_compile_the_marks_out():
    assert not hasattr(stream_kernel().module, "_pass_marks")
    assert not hasattr(native_build().module, "_pass_marks")


@pytest.mark.skipif(native_build().module is None, reason="the C++ layer loop does not build here")
def test_every_step_of_every_arm_is_timed_through_the_marked_build(pass_marks, capsys):
    results = pass_marks.main(["--model", "zoo:code-target", "--lengths", "40", "--passes", "2", "--warmup", "1",
                               "--threads", "1"])
    by_kind = results[40]
    assert set(by_kind) == set(pass_marks.KINDS)
    layer_steps = ["norm1", "qkv: region start -> region end", "rope+cache", "attention",
                   "o: region start -> region end", "residual1", "norm2", "gate+up: region start -> region end",
                   "silu", "mul", "down: region start -> region end", "head: region start -> region end"]
    for arm in by_kind.values():
        assert all(arm["steps"][step][0] > 0 for step in layer_steps), sorted(arm["steps"])
        parts = arm["parts"]
        whole = parts["whole pass"]
        assert 0 < parts["products' parallel regions"] < whole and parts["serial work between the first mark and the "
                                                                           "last"] > 0
    printed = capsys.readouterr().out
    assert "cache 40: the pass split, ms (medians over passes)" in printed and "| attention |" in printed
