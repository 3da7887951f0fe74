"""The batched loop's per-pass debug log (logger ``specfamily.core.batch_log``, level DEBUG; silent otherwise).

One line a pass: the pass's kind (``prefill``: a pass with a newcomer's prompt; ``steady``), the batch's last wave
(the requests still waiting, or ``-`` outside one) and per slot: the request, its tokens left
before the pass, its value to the plan and its projected end in passes (``batch_goodput.projected_ends``, in a last
wave), the draft length fed, the tokens accepted, then the rows fed and the pass's seconds. Enable it with
``logging.getLogger("specfamily.core.batch_log").setLevel(logging.DEBUG)`` and a handler.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from specfamily.core.batch_goodput import last_wave, projected_ends

__all__ = ["SlotLine", "enabled", "log_pass", "slot_lines"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotLine:
    """One slot on one pass: its request, tokens left before the pass, the draft length fed, tokens accepted."""

    request: int
    remaining: int
    fed: int
    accepted: int


def slot_lines(requests: Sequence[int], left: Sequence[int], drafts: Sequence, verdicts: Sequence) -> list[SlotLine]:
    """Each slot's line from its request's index, its tokens left before the pass, its draft and its verdict
    (accepted nodes, next token)."""
    return [SlotLine(i, n, len(d), len(v[0])) for i, n, d, v in zip(requests, left, drafts, verdicts, strict=True)]


def enabled() -> bool:
    return log.isEnabledFor(logging.DEBUG)


def log_pass(number: int, steady: bool, wave: int | None, budget: int, slots: Sequence[SlotLine],
             rows: int, seconds: float) -> None:
    """Log one pass (a no-op unless DEBUG is enabled for this module's logger)."""
    if not enabled():
        return
    remaining = [s.remaining for s in slots]
    if wave is not None and steady and wave <= len(slots):
        values, ends = last_wave(remaining, wave, budget), projected_ends(remaining, wave, budget)
    else:
        values, ends = [1.0] * len(slots), [None] * len(slots)
    parts = [f"r{s.request} left={s.remaining} v={v:.0f} end={'-' if e is None else e} g={s.fed} a={s.accepted}"
             for s, v, e in zip(slots, values, ends, strict=True)]
    log.debug("pass %d %s wave=%s | %s | rows=%d %.1f ms", number, "steady" if steady else "prefill",
              "-" if wave is None else wave, "; ".join(parts), rows, 1e3 * seconds)
