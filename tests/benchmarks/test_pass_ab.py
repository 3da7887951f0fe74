"""benchmarks/pass_ab.py on the shipped code target: every arm at every length in one process, and two sides
alternated in fresh processes (this checkout against itself), not its numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def pass_ab(benchmark_module):
    return benchmark_module("pass_ab")


def test_every_arm_at_every_length(pass_ab, tmp_path):
    out = tmp_path / "side.json"
    result = pass_ab.main(["--model", "zoo:code-target", "--lengths", "16,40", "--passes", "2", "--threads", "1",
                           "--json", str(out)])
    assert sorted(result) == ["16", "40"] and all(set(arms) == {"plain", "chain", "tree"} for arms in result.values())
    assert all(ms > 0 for arms in result.values() for ms in arms.values())
    assert out.read_text(encoding="utf-8").startswith('{"16": {"plain": ')


def test_two_sides_alternate_in_fresh_processes(pass_ab, capsys):
    rounds = pass_ab.main(["--model", "zoo:code-target", "--lengths", "16", "--passes", "1", "--threads", "1",
                           "--other", str(BENCHMARKS.parent), "--rounds", "2"])
    assert [len(rounds[side]) for side in ("this", "other")] == [2, 2]
    printed = capsys.readouterr().out
    assert printed.index("round 1 this") < printed.index("round 1 other") < printed.index("round 2 this")
    assert "| 16 | tree |" in printed and "this - other" in printed
