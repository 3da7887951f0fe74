"""benchmarks/pass_cost.py on the shipped code target: the table's plumbing (every kind at every length, the
products alone, the profiler's sections), not its numbers."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def pass_cost(benchmark_module):
    return benchmark_module("pass_cost")


def test_tiny_run_times_every_kind_and_profiles(pass_cost, capsys):
    results = pass_cost.main(["--model", "zoo:code-target", "--matmul", "skinny", "--lengths", "16,40",
                              "--repeats", "1", "--gb", "0.001", "--threads", "1", "--profile", "--grouped"])
    assert sorted(results) == [16, 40]
    kinds = {*pass_cost.KINDS, "chain grouped", "tree grouped"}
    assert all(set(by_kind) == kinds and min(by_kind.values()) > 0 for by_kind in results.values())
    printed = capsys.readouterr().out
    assert "| cache L | plain ms | chain ms | tree ms |" in printed and "products alone" in printed
    assert "| chain packed / grouped |" in printed
    assert "tree pass at L=40" in printed and "| attention |" in printed and "| matmul |" in printed


def test_the_tree_kind_commits_a_path_that_moves():
    """The tree's kept path is the second branch: every kept node moves in the cache (the rewrite is timed)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        shapes = importlib.import_module("pass_cost").Shapes(4)
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert shapes.tree_parents == [-1, -1, 0, 1] and shapes.tree_path == [1, 3] and shapes.chain_path == [0, 1]
    assert all(node != i for i, node in enumerate(shapes.tree_path))


def test_compile_pass_times_the_compiled_passes_beside_the_eager_ones(pass_cost, capsys, monkeypatch):
    """--compile-pass's plumbing, torch.compile replaced by the identity (the graph's function runs eagerly)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    results = pass_cost.main(["--model", "zoo:code-target", "--matmul", "skinny", "--lengths", "16,40",
                              "--repeats", "1", "--gb", "0.001", "--threads", "1", "--compile-pass"])
    kinds = {*pass_cost.KINDS, *(kind + pass_cost.COMPILED for kind in pass_cost.KINDS)}
    assert all(set(by_kind) == kinds and min(by_kind.values()) > 0 for by_kind in results.values())
    printed = capsys.readouterr().out
    assert "compiled whole pass: first passes (compiling 2 graphs, fed rows [1, 8])" in printed
    assert "| cache L | plain eager ms | plain compiled ms | plain compiled / eager |" in printed


def test_native_times_the_native_loop_beside_the_python_loop(pass_cost, capsys):
    """--native's plumbing: both loops timed interleaved, their logits compared bit for bit, the native one profiled."""
    from specfamily.runtime.native_layers import native_build

    if not native_build().available:
        pytest.skip(f"no native layers: {native_build().reason}")
    results = pass_cost.main(["--model", "zoo:code-target", "--matmul", "stream", "--lengths", "16,40",
                              "--repeats", "1", "--gb", "0.001", "--threads", "1", "--native", "--profile",
                              "--profile-kind", "plain"])
    kinds = {*pass_cost.KINDS, *(kind + pass_cost.NATIVE for kind in pass_cost.KINDS)}
    assert all(set(by_kind) == kinds and min(by_kind.values()) > 0 for by_kind in results.values())
    printed = capsys.readouterr().out
    assert ("native layer loop: logits bit-identical to the Python loop's (one pass of each kind at each length; 6 "
            "native passes)") in printed
    assert "| cache L | plain native ms | chain native ms | tree native ms |" in printed
    assert "profiled: the native layer loop" in printed
