"""benchmarks/kernel_rows.py on tiny shapes: the report's plumbing (every row count, t(rows)/t(1), the resident
weight, the same-bits check between kernels), not its numbers. The --baseline build (a second compile) is not run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def kernel_rows(benchmark_module):
    return benchmark_module("kernel_rows")


def _stream_or_skip():
    from specfamily.runtime.kernel import stream_kernel

    built = stream_kernel()
    if not built.available:
        pytest.skip(f"stream kernel unavailable: {built.reason}")
    return built.module


def test_tiny_run_times_every_row_count(kernel_rows, capsys):
    _stream_or_skip()
    report = kernel_rows.main(
        ["--shape", "tiny", "--weights", "random", "--repeats", "2", "--rows", "1,3,5", "--clock", "cpu"]
    )
    assert report.threads == 1 and report.weights == "random, tiny shapes"
    assert list(report.seconds) == ["this checkout"] and sorted(report.seconds["this checkout"]) == [1, 3, 5]
    ratios = report.ratios("this checkout")
    assert ratios[1] == 1.0 and ratios[5] == report.seconds["this checkout"][5] / report.seconds["this checkout"][1]
    printed = capsys.readouterr().out
    assert "t(rows) / t(1):" in printed and "| this checkout | 1.000 |" in printed and "load average" in printed


def test_resident_weights_hold_as_many_elements_in_one_weight(kernel_rows):
    weights = [torch.zeros(576, 1536), torch.zeros(49152, 576)]
    resident = kernel_rows.resident_weights(weights)
    assert len({id(w) for w in resident}) == 1 and resident[0].shape == kernel_rows.RESIDENT
    assert len(resident) == round((576 * 1536 + 49152 * 576) / 576**2) == 88


def test_kernels_that_give_other_bits_are_refused(kernel_rows):
    weights = [torch.randn(20, 8)]
    same = {"a": F.linear, "b": lambda x, w: F.linear(x, w)}
    kernel_rows.check_same_bits(weights, same, [1, 3])
    other = {"a": F.linear, "b": lambda x, w: F.linear(x, w) * (1 + 2**-20)}
    with pytest.raises(SystemExit, match=r"the kernels give other bits at 1 rows on a \(20, 8\) weight"):
        kernel_rows.check_same_bits(weights, other, [1, 3])


def test_bad_rows_are_refused(kernel_rows):
    with pytest.raises(SystemExit, match="--rows must be positive integers"):
        kernel_rows.parse_args(["--rows", "0,2"])
    with pytest.raises(SystemExit, match="--rows must be positive integers"):
        kernel_rows.parse_args(["--rows", "1,x"])
