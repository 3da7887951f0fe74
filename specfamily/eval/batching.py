"""The runner's load settings: how many requests decode at once (``batch_size``) and when they arrive
(``arrival_rate``), checked before any model loads; the seeded Poisson arrivals; each request's timing.

``batch_size: 1`` with ``arrival_rate: null`` (and ``batched: false``) is the runner's batch-1 path
(``sf.generate`` prompt by prompt, arms interleaved). Anything else is the batched arm
(:mod:`specfamily.eval.batched`): every arm decodes the prompt set through ``sf.generate_batch`` with
``max_batch = batch_size``, the requests arriving all at once (``arrival_rate: null``) or as a Poisson process of
``arrival_rate`` requests per second. ``batched: true`` takes the batched arm at batch size 1 too (a sweep's B=1
point, timed as the others: wall and CPU seconds of each call).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

NAN = float("nan")


@dataclass(frozen=True)
class BatchSettings:
    """``batch_size`` (max_batch: requests decoded at once) and ``arrival_rate`` (requests per second; None: all at
    once)."""

    batch_size: int = 1
    arrival_rate: float | None = None
    force: bool = False  # ``batched: true``: the batched arm even at batch size 1 with every request at once

    @property
    def batched(self) -> bool:
        """Whether the run takes the batched arm (else the batch-1 path, ``sf.generate`` per prompt)."""
        return self.force or self.batch_size > 1 or self.arrival_rate is not None

    @classmethod
    def from_config(cls, cfg: Any) -> BatchSettings:
        """The settings of a composed config (missing keys: the defaults); a bad value is a one-line ValueError
        naming its key (a ConfigError through ``check_config``)."""
        size, rate, force = cfg.get("batch_size", 1), cfg.get("arrival_rate", None), cfg.get("batched", False)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"batch_size: must be an integer >= 1 (requests decoded at once), got {size!r}")
        if not isinstance(force, bool):
            raise ValueError(f"batched: must be true or false, got {force!r}")
        if rate is None:
            return cls(size, None, force)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"arrival_rate: must be a positive number of requests per second or null (all at "
                              f"once), got {rate!r}")
        return cls(size, float(rate), force)


def poisson_arrivals(n: int, rate: float | None, seed: int) -> list[float] | None:
    """Arrival times in seconds of ``n`` requests of a Poisson process of ``rate`` per second: exponential gaps
    (mean 1 / rate) drawn from a generator seeded ``seed``, the first request at 0 (a Poisson process seen from its
    first arrival). None when ``rate`` is None (every request at once)."""
    if rate is None:
        return None
    if n <= 0:
        return []
    generator = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n - 1, dtype=torch.float64).exponential_(rate, generator=generator)
    return [0.0, *torch.cumsum(gaps, 0).tolist()]


@dataclass(frozen=True)
class RequestTiming:
    """One request of a batched call, in seconds from the call's start: when it arrived, got its first token and
    finished; ``latency`` = finish - arrival, ``ttft`` = first token - arrival (nan when not measured)."""

    arrival: float
    first_token: float
    finish: float

    @property
    def latency(self) -> float:
        return self.finish - self.arrival

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    def tokens_per_second(self, new_tokens: int) -> float:
        """The request's own speed: its new tokens over its latency."""
        return new_tokens / self.latency if self.latency > 0 else NAN
