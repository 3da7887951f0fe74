"""benchmarks/attention_rows.py on tiny shapes: the report's plumbing (every length and row count, best and median,
t(rows)/t(1)) and the chain's visibility, not its numbers. The --baseline build (a second compile) is not run."""

from __future__ import annotations

import pytest


@pytest.fixture
def attention_rows(benchmark_module):
    return benchmark_module("attention_rows")


def test_a_chain_row_sees_the_cache_up_to_its_own_key(attention_rows):
    assert attention_rows.chain_visible(1, 10) is None
    seen = attention_rows.chain_visible(3, 10)
    assert seen.tolist() == [[True] * 8 + [False] * 2, [True] * 9 + [False], [True] * 10]


def test_a_tree_row_sees_the_cache_the_root_its_ancestors_and_itself(attention_rows):
    assert attention_rows.tree_visible(1, 10) is None
    seen = attention_rows.tree_visible(5, 8)  # 3 cached keys, the root, nodes 0-3 with parents [-1, -1, 0, 1]
    assert seen.int().tolist() == [
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1, 0, 1],
    ]


def test_tiny_run_times_every_length_and_row_count(attention_rows, capsys):
    from specfamily.runtime.attention import attention_build

    if not attention_build().available:
        pytest.skip(f"attention kernel unavailable: {attention_build().reason}")
    report = attention_rows.main(["--lengths", "40,70", "--rows", "1,3", "--layers", "2", "--repeats", "2"])
    assert sorted(report) == [("this checkout", n, r) for n in (40, 70) for r in (1, 3)]
    assert all(0 < best <= median for best, median in report.values())
    printed = capsys.readouterr().out
    assert "| this checkout | 70 | 3 |" in printed and "load" in printed and "1 threads, clock cpu" in printed
