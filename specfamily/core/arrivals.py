"""When requests arrive at the batched loop, and the clock it reads them with.

``generate_batch(..., arrivals=...)`` admits request i no earlier than ``arrivals[i]`` seconds after its call; the
order of admission is the order of arrival (ties by index). :class:`LoopClock` is the loop's clock and its way of
waiting for the next arrival, injectable so that tests and simulations run on a fake clock without sleeping.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["LoopClock", "arrival_order", "check_arrivals"]


@dataclass(frozen=True)
class LoopClock:
    """``now()``: seconds on a monotonic clock; ``sleep(seconds)``: wait that long (a fake clock advances)."""

    now: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep

    def wait_until(self, moment: float) -> None:
        """Return once ``now() >= moment``."""
        while (left := moment - self.now()) > 0:
            self.sleep(left)


def check_arrivals(arrivals: Sequence[float] | None, count: int) -> list[float]:
    """Each request's arrival in seconds after the call (all 0.0 for None); refuses a wrong length, a value that is
    not a finite number >= 0. Arrivals need not be sorted."""
    if arrivals is None:
        return [0.0] * count
    if isinstance(arrivals, (str, bytes)) or not isinstance(arrivals, Sequence):
        raise TypeError(f"arrivals must be a sequence of seconds, got {type(arrivals).__name__}")
    if len(arrivals) != count:
        raise ValueError(f"arrivals has {len(arrivals)} entries for {count} prompts")
    checked = []
    for i, value in enumerate(arrivals):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"arrivals[{i}] must be a number of seconds, got {type(value).__name__}")
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"arrivals[{i}] must be a finite number of seconds >= 0, got {value!r}")
        checked.append(float(value))
    return checked


def arrival_order(arrivals: Sequence[float]) -> list[int]:
    """Request indices in the order they arrive (earliest first, ties by index)."""
    return sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
