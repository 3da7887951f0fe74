"""benchmarks/attention.py on the shipped code target: the check and the table's plumbing, not its numbers."""

from __future__ import annotations

import pytest

from specfamily.runtime.attention import attention_build


@pytest.fixture
def script(benchmark_module):
    return benchmark_module("attention")


@pytest.mark.skipif(not attention_build().available, reason=f"no attention kernel: {attention_build().reason}")
def test_tiny_run_checks_the_rows_and_times_every_arm_and_kind(script, capsys):
    results = script.main(["--model", "zoo:code-target", "--lengths", "16,40", "--repeats", "1", "--rounds", "1",
                           "--threads", "1"])
    assert sorted(results) == [16, 40]
    runs = {(arm, kind) for arm in script.ARMS for kind in ("plain", "chain", "tree")}
    assert all(set(by_run) == runs and min(by_run.values()) > 0 for by_run in results.values())
    printed = capsys.readouterr().out
    assert printed.count("chain rows == plain passes (kernel), bit for bit") == 2
    assert "| cache L | plain sdpa ms | plain kernel ms | plain kernel / sdpa |" in printed
