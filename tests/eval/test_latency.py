"""The report's latency and memory table from per-request metrics."""

from __future__ import annotations

import math

from specfamily.eval.latency import latency_markdown, latency_rows
from specfamily.eval.results import FailureRecord, PromptRecord


def _record(drafter, index, ttft, p50, p99, peak, decode=1.0, new_tokens=11):
    metrics = {"time_to_first_token": ttft, "prefill_seconds": ttft / 2, "decode_seconds": decode,
               "new_tokens": new_tokens, "token_latency_p50": p50, "token_latency_p90": p50, "token_latency_p99": p99,
               "peak_memory_bytes": peak, "peak_memory_kind": "rss_peak"}
    return PromptRecord(drafter, "set", "greedy", f"p{index}", index, index, None, 5, [1] * new_tokens, 1.0, False,
                        metrics)


def test_rows_take_medians_over_prompts_the_largest_peak_and_pooled_decode_rate():
    records = [_record("plain", 0, 0.010, 0.002, 0.004, 100 * 2**20), _record("plain", 1, 0.030, 0.004, 0.009,
               300 * 2**20, decode=3.0), _record("plain", 2, 0.020, 0.003, 0.005, 200 * 2**20),
               FailureRecord("eagle", "create", "ValueError: no")]
    (row,) = latency_rows(records, ".")
    assert (row.drafter, row.prompts, row.ttft, row.p50, row.p99) == ("plain", 3, 0.020, 0.003, 0.005)
    assert row.decode_tokens_per_second == 30 / 5.0 and row.peak_memory_bytes == 300 * 2**20
    text = latency_markdown([row])
    assert "| plain | 3 | 20.00 | 10.00 | 6.0 | 3.00 | 3.00 | 5.00 | 300.0 | rss_peak |" in text


def test_older_records_without_latency_leave_the_section_out():
    old = PromptRecord("plain", "set", "greedy", "p0", 0, 0, None, 5, [1], 1.0, False, {"new_tokens": 1})
    (row,) = latency_rows([old], ".")
    assert math.isnan(row.ttft) and row.peak_memory_bytes is None
    assert latency_markdown([row]) == ""
