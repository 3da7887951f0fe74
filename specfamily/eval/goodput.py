"""The report's load section: each arm's goodput and its requests' latency, time to first token and tokens/s.

Goodput = committed new tokens per second of wall time of the whole run: the arm's tokens over the wall seconds of
its batched calls (one per turn, :mod:`specfamily.eval.batched`), or, for a batch-1 run, over the sum of its
requests' seconds (they run one after the other). ``speedup`` is the arm's goodput over plain decoding's in the same
run, at the same batch size and arrivals. Latency = finish - arrival of each request, time to first token = first
token - arrival; medians and the 90th percentile over the arm's requests.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from specfamily.eval.config import PLAIN
from specfamily.eval.results import PromptRecord, Record

NAN = float("nan")
COLUMNS = ("drafter", "batch", "arrivals/s", "requests", "goodput tok/s", "speedup", "latency p50 s",
           "latency p90 s", "ttft p50 s", "request tok/s p50")


@dataclass
class GoodputRow:
    """One arm of one run under load."""

    run: str
    drafter: str
    batch_size: int
    arrival_rate: float | None
    requests: int
    new_tokens: int
    seconds: float  # wall seconds of the arm's calls
    cpu_seconds: float  # their CPU time (nan for a batch-1 run, which does not record it)
    goodput: float  # new_tokens / seconds
    speedup: float  # goodput / plain decoding's goodput in the same run
    latency_p50: float
    latency_p90: float
    ttft_p50: float
    request_tps_p50: float
    batched: bool = True  # decoded through the batched arm (False: the runner's batch-1 path)

    @property
    def cpu_goodput(self) -> float:
        return self.new_tokens / self.cpu_seconds if self.cpu_seconds > 0 else NAN


def _percentile(values: list[float | None], q: float) -> float:
    finite = sorted(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return NAN
    return statistics.quantiles(finite, n=100, method="inclusive")[int(q) - 1] if len(finite) > 1 else finite[0]


def _calls(records: list[PromptRecord]) -> tuple[float, float]:
    """(wall, cpu) seconds of the arm's distinct calls; a batch-1 arm: its requests' wall seconds, cpu nan."""
    if any(r.batch is None for r in records):
        return sum(r.wall_seconds for r in records), NAN
    calls = {(r.turn, r.batch["call_wall_seconds"]): r.batch["call_cpu_seconds"] for r in records}
    return sum(wall for _, wall in calls), sum(calls.values())


def _row(run: str, drafter: str, records: list[PromptRecord]) -> GoodputRow:
    wall, cpu = _calls(records)
    tokens = sum(r.metrics["new_tokens"] for r in records)
    batch = records[0].batch or {}
    latencies = [r.batch["latency_s"] if r.batch else r.wall_seconds for r in records]
    ttfts = [r.batch["ttft_s"] if r.batch else r.metrics.get("time_to_first_token") for r in records]
    rates = [r.batch["tokens_per_second"] if r.batch else (len(r.tokens) / r.wall_seconds if r.wall_seconds > 0
             else None) for r in records]
    return GoodputRow(run, drafter, int(batch.get("size", 1)), batch.get("arrival_rate"), len(records), tokens, wall,
                      cpu, tokens / wall if wall > 0 else NAN, NAN, _percentile(latencies, 50),
                      _percentile(latencies, 90), _percentile(ttfts, 50), _percentile(rates, 50),
                      all(r.batch is not None for r in records))


def goodput_rows(records: list[Record], run: str) -> list[GoodputRow]:
    """One row per arm of a run (in the order the arms first appear), speedup against plain decoding's goodput."""
    prompts = [r for r in records if isinstance(r, PromptRecord)]
    rows = [_row(run, label, [r for r in prompts if r.drafter == label]) for label in dict.fromkeys(
        r.drafter for r in prompts)]
    plain = next((row.goodput for row in rows if row.drafter == PLAIN), NAN)
    for row in rows:
        row.speedup = row.goodput / plain if plain > 0 else NAN
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def goodput_markdown(rows: list[GoodputRow]) -> str:
    """The "Load" section, for runs with a batched arm ("" when every row is from the batch-1 path)."""
    if not any(row.batched for row in rows):
        return ""
    several = len({row.run for row in rows}) > 1
    header = ["run", *COLUMNS] if several else list(COLUMNS)
    lines = ["## Load: goodput and latency\n", "| " + " | ".join(header) + " |",
             "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        rate = "all at once" if row.arrival_rate is None else f"{row.arrival_rate:g}"
        cells = [row.drafter, str(row.batch_size), rate, str(row.requests), _fmt(row.goodput, 1), _fmt(row.speedup),
                 _fmt(row.latency_p50), _fmt(row.latency_p90), _fmt(row.ttft_p50), _fmt(row.request_tps_p50, 1)]
        lines.append("| " + " | ".join(([row.run] if several else []) + cells) + " |")
    return "\n".join(lines) + "\n\n" + GOODPUT_NOTES


GOODPUT_NOTES = """\
goodput = the arm's new tokens / the wall seconds of its batched calls (every request of a call decoded with at
most `batch` at once); speedup = goodput / plain decoding's goodput in the same run. latency = a request's finish
- its arrival, ttft = its first token - its arrival (seconds; "-" where the loop did not report it), request tok/s =
its new tokens / its latency: medians (p50) and 90th percentile over the arm's requests. In a batched run the
comparison table's speedup is over the requests' latencies (each request's wall seconds is its latency), this one
over the run's throughput.
"""
