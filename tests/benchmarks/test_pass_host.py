"""benchmarks/pass_host.py on the shipped code target: every kind split into every step, not its numbers."""

from __future__ import annotations

import pytest


@pytest.fixture
def pass_host(benchmark_module):
    return benchmark_module("pass_host")


def test_every_kind_is_split_into_its_host_steps(pass_host, capsys):
    results = pass_host.main(["--model", "zoo:code-target", "--matmul", "skinny", "--lengths", "16,40",
                              "--repeats", "2", "--threads", "1"])
    assert sorted(results) == [16, 40]
    for by_kind in results.values():
        assert set(by_kind) == set(pass_host.KINDS)
        for steps in by_kind.values():
            assert set(steps) == set(pass_host.STEPS)
            assert steps["head"] > 0 and steps["prepare"] > 0 and steps["verify"] > 0 and steps["commit"] > 0
            assert steps["layers"] == 0 and steps["lean rest"] > 0  # skinny: no C++ loop, the layers run in Python
        assert by_kind["tree"]["commit"] > 0 and by_kind["plain"]["draft+mask"] > 0
    printed = capsys.readouterr().out
    assert "cache 40: ms per pass (median)" in printed and "| commit |" in printed and "| total |" in printed
