"""The report's latency and memory table: time to first token, prefill, decoding, per-token latency, peak memory.

One row per drafter (or plain decoding) and run, from the per-request metrics the decode loop measured
(:mod:`specfamily.core.trace`): the median over the drafter's prompt records of each record's time to first token,
prefill, per-token latency p50 / p90 / p99, the decoding throughput (new tokens after the first over the decoding
seconds, summed over records) and the largest peak memory of any of its records. Records written before these
were measured give "-".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from specfamily.eval.results import PromptRecord, Record

NAN = float("nan")
LATENCY_COLUMNS = ("drafter", "prompts", "ttft ms", "prefill ms", "decode tok/s", "p50 ms", "p90 ms", "p99 ms",
                   "peak memory MiB", "memory")
_RUN_COLUMN = "run"


@dataclass
class LatencyRow:
    """One drafter's latency and memory in one run (seconds; nan where nothing was measured)."""

    run: str
    drafter: str
    prompts: int
    ttft: float
    prefill: float
    decode_tokens_per_second: float
    p50: float
    p90: float
    p99: float
    peak_memory_bytes: int | None
    memory_kind: str


def _median(records: list[PromptRecord], key: str) -> float:
    values = [r.metrics.get(key) for r in records]
    values = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(values) if values else NAN


def _decode_rate(records: list[PromptRecord]) -> float:
    timed = [r for r in records if r.metrics.get("decode_seconds") is not None]
    seconds = sum(r.metrics["decode_seconds"] for r in timed)
    tokens = sum(max(0, r.metrics["new_tokens"] - 1) for r in timed)
    return tokens / seconds if seconds > 0 else NAN


def latency_rows(records: list[Record], run: str) -> list[LatencyRow]:
    """Every drafter's row of one run, in the order the drafters first appear."""
    prompts = [r for r in records if isinstance(r, PromptRecord)]
    rows = []
    for drafter in dict.fromkeys(r.drafter for r in prompts):
        mine = [r for r in prompts if r.drafter == drafter]
        peaks = [r.metrics.get("peak_memory_bytes") for r in mine if r.metrics.get("peak_memory_bytes") is not None]
        kinds = sorted({r.metrics.get("peak_memory_kind") or "" for r in mine} - {""})
        rows.append(LatencyRow(run, drafter, len(mine), _median(mine, "time_to_first_token"),
                               _median(mine, "prefill_seconds"), _decode_rate(mine),
                               _median(mine, "token_latency_p50"), _median(mine, "token_latency_p90"),
                               _median(mine, "token_latency_p99"), max(peaks) if peaks else None, ", ".join(kinds)))
    return rows


def _ms(seconds: float) -> str:
    return "-" if not math.isfinite(seconds) else f"{seconds * 1e3:.2f}"


def latency_cells(row: LatencyRow) -> list[str]:
    """The row's cells, as :data:`LATENCY_COLUMNS` shows them (the HTML view shows the same strings)."""
    rate = "-" if not math.isfinite(row.decode_tokens_per_second) else f"{row.decode_tokens_per_second:.1f}"
    memory = "-" if row.peak_memory_bytes is None else f"{row.peak_memory_bytes / 2**20:.1f}"
    return [row.drafter, str(row.prompts), _ms(row.ttft), _ms(row.prefill), rate, _ms(row.p50), _ms(row.p90),
            _ms(row.p99), memory, row.memory_kind or "-"]


def latency_table(rows: list[LatencyRow]) -> tuple[list[str], list[list[str]]]:
    """Header and cells; a run column first when the rows come from several runs."""
    several = len({row.run for row in rows}) > 1
    header = [_RUN_COLUMN, *LATENCY_COLUMNS] if several else list(LATENCY_COLUMNS)
    return header, [([row.run] if several else []) + latency_cells(row) for row in rows]


LATENCY_NOTES = """\
ttft = time to first token (drafter.begin and the prefill pass included); prefill = the prompt's pass alone;
decode tok/s = new tokens after the first / the seconds after the first token; p50/p90/p99 = per-token latency
after the first token (each pass's interval shared among the tokens it kept). ttft, prefill and the percentiles
are medians over prompts; peak memory is the largest of any prompt's (rss_peak: the process's resident set during
the request; cuda_max_allocated: torch's allocator on the GPU).
"""


def latency_markdown(rows: list[LatencyRow]) -> str:
    """The "Latency and memory" section ("" when no record measured any of it)."""
    if not any(math.isfinite(row.ttft) for row in rows):
        return ""
    header, cells = latency_table(rows)
    lines = ["## Latency and memory\n", "| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n\n" + LATENCY_NOTES
