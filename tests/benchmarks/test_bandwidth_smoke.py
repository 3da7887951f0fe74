"""benchmarks/bandwidth.py on tiny shapes: the report's plumbing (bandwidth, bytes, every kind by pass size), not
its numbers."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def bandwidth(benchmark_module):
    return benchmark_module("bandwidth")


def test_tiny_run_reports_every_kind_beside_the_floor(bandwidth, tmp_path, capsys):
    out = tmp_path / "bandwidth.json"
    report = bandwidth.main(["--shape", "tiny", "--weights", "random", "--gb", "0.001", "--repeats", "1",
                             "--sizes", "1,3,17", "--threads", "1", "--json", str(out)])
    tiny = bandwidth.SHAPES["tiny"]
    assert report.bytes_read == 4 * sum(o * i for o, i in tiny.weights()) and len(tiny.weights()) == 2 * 7 + 1
    assert report.bandwidth > 0 and report.floor > 0 and report.weights == "random, tiny shapes"
    timed = set(report.seconds) | set(report.unavailable)
    assert timed == {"exact", "skinny", "stream"}
    assert all(sorted(by_k) == [1, 3, 17] and min(by_k.values()) > 0 for by_k in report.seconds.values())
    printed = capsys.readouterr().out
    assert "| floor |" in printed and "t(k) / t(1):" in printed and "| exact |" in printed
    if "stream" in report.seconds:  # its memory cost: one packed copy per weight (tiny's sizes are 16-row multiples)
        assert report.packed_bytes == report.bytes_read
        assert f"(packed copies: {report.bytes_read / 1e6:.0f} MB more)" in printed
    else:
        assert report.packed_bytes == 0 and "packed copies" not in printed
    assert json.loads(out.read_text())["bytes_read"] == report.bytes_read


def test_smollm2_shapes_read_what_its_pass_reads(bandwidth):
    shapes = bandwidth.SHAPES["smollm2"].weights()
    assert len(shapes) == 30 * 7 + 1 and shapes[-1] == (49152, 576)
    layers = sum(o * i for o, i in shapes[:-1]) * 4
    assert round(layers / 1e6) == 425  # the 425 MB of decoder-layer weights


def test_bad_sizes_are_refused(bandwidth):
    with pytest.raises(SystemExit, match="--sizes must be positive integers"):
        bandwidth.measure(bandwidth.parse_args(["--sizes", "0", "--shape", "tiny", "--gb", "0.001"]))


def test_the_floor_takes_the_faster_probe_and_names_both(bandwidth):
    best, probes = bandwidth.floor_bandwidth(0.002, 1)
    assert probes["sum"] > 0 and best == max(probes.values())
    if bandwidth.stream_kernel().available:
        assert set(probes) == {"sum", "stream product"} and probes["stream product"] > 0
    else:
        assert set(probes) == {"sum"}
    assert bandwidth.probe_text({"sum": 28.14e9, "stream product": 30.2e9}) == "sum 28.1 GB/s, stream product 30.2 GB/s"


def test_the_kernel_probe_counts_the_bytes_it_read_and_keeps_no_copy(bandwidth, monkeypatch):
    if not bandwidth.stream_kernel().available:
        assert bandwidth.kernel_read_bandwidth(0.001, 1) is None
        return
    reads = []
    monkeypatch.setattr(bandwidth, "packed_bytes", lambda weights: reads.append(list(weights)) or 1_000_000)
    clock = iter(range(100))
    monkeypatch.setattr(bandwidth.time, "perf_counter", lambda: next(clock) * 0.001)
    assert bandwidth.kernel_read_bandwidth(0.001, 3) == 1e9  # 1 MB in 1 ms, the best of three timed calls
    assert len(reads) == 1 and reads[0][0].shape == (1_000_000 // 4 // 576, 576)
