"""The trace of one request's passes, and the latency numbers read from it.

The decode loop hands a :class:`TraceRecorder` every target pass (the prefill first): the draft (tokens, parents),
the accepted path, the target's token after it (``bonus``), how many committed tokens were kept (the budget or an
EOS can cut the last pass), the pass's draft and verify seconds and the moment its tokens were known. ``finish``
turns it into a :class:`Trace` and fills the request's latency metrics:

- ``time_to_first_token``: from the start of the request (``drafter.begin`` included) to the first pass's token;
- ``decode_seconds``: the rest of the request (``total_seconds - time_to_first_token``);
- ``token_latency_p50/p90/p99``: over the tokens after the first, each token of a pass that kept k tokens gets
  that pass's interval (from the previous pass's tokens to its own) / k;
- ``peak_memory_bytes`` with ``peak_memory_kind`` (:mod:`specfamily.core.memory`).

Where each kept token came from (:func:`token_origins`): accepted at depth d >= 1, the bonus token (the target's
token after an accepted path that reached a leaf of the draft: nothing left to reject), or the target's own token
(plain decoding, a pass without a draft, or the token sampled after a rejection).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specfamily.core.memory import PeakMemory
from specfamily.core.metrics import NAN, Metrics

TARGET = 0  # origin of a token the target chose without a draft to confirm it
BONUS = -1  # origin of the target's token after an accepted path that reached a leaf

_COLUMNS = ("draft_tokens", "parents", "accepted", "bonus", "kept", "draft_seconds", "verify_seconds", "end_seconds")


@dataclass
class Trace:
    """Every pass of one request, column by column (index i is pass i; pass 0 is the prefill).

    ``draft_tokens[i]`` / ``parents[i]``: the draft verified in pass i (empty lists: none); ``accepted[i]``: the
    accepted node indices from the root down; ``bonus[i]``: the target's token committed after them; ``kept[i]``:
    how many of the pass's committed tokens (accepted + 1) were kept; ``end_seconds[i]``: when its tokens were
    known, from the start of the request.
    """

    draft_tokens: list[list[int]] = field(default_factory=list)
    parents: list[list[int]] = field(default_factory=list)
    accepted: list[list[int]] = field(default_factory=list)
    bonus: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    draft_seconds: list[float] = field(default_factory=list)
    verify_seconds: list[float] = field(default_factory=list)
    end_seconds: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.kept)

    def as_dict(self) -> dict[str, list[Any]]:
        """Columns for JSON (seconds rounded to the microsecond)."""
        data = {name: getattr(self, name) for name in _COLUMNS}
        for name in ("draft_seconds", "verify_seconds", "end_seconds"):
            data[name] = [round(value, 6) for value in data[name]]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, list[Any]]) -> Trace:
        return cls(**{name: list(data[name]) for name in _COLUMNS})


def token_origins(trace: Trace) -> list[int]:
    """Per kept token, in order: its depth d >= 1 when it was an accepted draft token, ``BONUS`` or ``TARGET``."""
    origins: list[int] = []
    for parents, accepted, kept in zip(trace.parents, trace.accepted, trace.kept, strict=True):
        last = accepted[-1] if accepted else -1
        leaf = bool(parents) and last not in parents
        origins += [*range(1, len(accepted) + 1), BONUS if leaf else TARGET][:kept]
    return origins


def token_latencies(end_seconds: list[float], kept: list[int]) -> list[float]:
    """Per token after the first pass's: its pass's interval since the previous pass's tokens / the tokens kept."""
    latencies: list[float] = []
    for i in range(1, len(end_seconds)):
        if kept[i]:
            latencies += [(end_seconds[i] - end_seconds[i - 1]) / kept[i]] * kept[i]
    return latencies


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between order statistics; nan when empty."""
    if not values:
        return NAN
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class TraceRecorder:
    """Collects one request's passes (``keep_passes=False``: only what the latency metrics need)."""

    clock: Callable[[], float]
    started: float
    memory: PeakMemory
    keep_passes: bool = True
    trace: Trace = field(default_factory=Trace)
    _drafts: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @classmethod
    def start(cls, clock: Callable[[], float], started: float, device: torch.device, keep_passes: bool = True):
        return cls(clock, started, PeakMemory.start(device), keep_passes)

    def record(self, tokens: torch.Tensor, parents: torch.Tensor, accepted: list[int], bonus: int, kept: int,
               draft_seconds: float, verify_seconds: float, end: float) -> None:
        """One pass: the draft's (n,) tokens and parents, the accepted nodes, the target's token after them, the
        committed tokens kept, the times; ``end`` is the loop clock's reading once the pass's tokens were known."""
        trace = self.trace
        trace.kept.append(kept)
        trace.end_seconds.append(end - self.started)
        if not self.keep_passes:
            return
        self._drafts.append((tokens.detach().clone(), parents.detach().clone()))  # no host sync here
        trace.accepted.append(list(accepted))
        trace.bonus.append(int(bonus))
        trace.draft_seconds.append(draft_seconds)
        trace.verify_seconds.append(verify_seconds)

    def finish(self, metrics: Metrics) -> tuple[Metrics, Trace | None]:
        """The request's metrics with its latency and memory filled in, and its trace (None without passes kept)."""
        trace = self.trace
        for tokens, parents in self._drafts:
            trace.draft_tokens.append(tokens.tolist())
            trace.parents.append(parents.tolist())
        self._drafts.clear()
        first = trace.end_seconds[0] if trace.end_seconds else NAN
        latencies = token_latencies(trace.end_seconds, trace.kept)
        filled = replace(
            metrics,
            time_to_first_token=first,
            decode_seconds=max(0.0, metrics.total_seconds - first) if trace.end_seconds else NAN,
            token_latency_p50=percentile(latencies, 50),
            token_latency_p90=percentile(latencies, 90),
            token_latency_p99=percentile(latencies, 99),
            peak_memory_bytes=self.memory.read(),
            peak_memory_kind=self.memory.kind,
        )
        return filled, (trace if self.keep_passes else None)
