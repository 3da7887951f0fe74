"""One drafter call over many batch slots at once: ragged rows over a ragged :class:`BatchCache`.

Slot b of a :class:`~specfamily.runtime.batch_cache.BatchCache` holds ``lengths[b]`` entries. A call feeds each slot
k_b rows (padded on the right to the widest); the cache writes slot b's row j at ``lengths[b] + j``, and the additive
4D mask lets a row see its slot's first ``base`` entries and, past them, what its ``visible`` block allows (a chain's
or a tree's own entries), never another slot's rows. A padding row sees only itself. After the call each fed slot's
length has grown by its rows: the caller keeps them, or sets the lengths back to drop them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specfamily.core.tree_mask import additive
from specfamily.runtime.batch_cache import BatchCache

__all__ = ["RowFeed", "ragged_call"]


@dataclass(frozen=True)
class RowFeed:
    """What one slot feeds in a call: k rows at positions, seeing its first ``base`` cached entries and, past them,
    what ``visible`` (k, length - base + k) allows (the slot's later cached entries, then the fed rows)."""

    ids: torch.Tensor  # (k,) long
    inputs: torch.Tensor | None  # (k, H) per-row inputs besides the ids (the EAGLE features), or None
    positions: torch.Tensor  # (k,) long
    base: int
    visible: torch.Tensor  # (k, length - base + k) bool


# step(ids (B, F), inputs (B, F, H) or None, positions (B, F), mask (B, 1, F, kv), cache) -> outputs (B, F, ...)
Step = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, object], torch.Tensor]


def ragged_call(step: Step, cache: BatchCache, feeds: list[RowFeed | None], dtype: torch.dtype,
                lo: int = 0) -> torch.Tensor:
    """One call of ``step`` over slots ``lo`` .. the last with a feed (``feeds[i]`` is slot ``lo + i``'s, None: padding
    only); each fed slot's length grows by its rows. Returns the outputs (B, width, ...); rows past a slot's k are
    padding."""
    hi = max(i for i, feed in enumerate(feeds) if feed is not None) + 1
    fed = [feed for feed in feeds[:hi] if feed is not None]
    width, device = max(f.ids.numel() for f in fed), fed[0].ids.device
    plan = cache.plan_pass(lo, lo + hi, width, device)
    ids = torch.zeros(hi, width, dtype=torch.long, device=device)
    inputs = None
    if fed[0].inputs is not None:
        inputs = torch.zeros(hi, width, fed[0].inputs.shape[-1], dtype=fed[0].inputs.dtype, device=device)
    positions = torch.zeros(hi, width, dtype=torch.long, device=device)
    mask = torch.full((hi, 1, width, plan.extent), torch.finfo(dtype).min, dtype=dtype, device=device)
    for i, feed in enumerate(feeds[:hi]):
        length, k = cache.lengths[lo + i], 0 if feed is None else feed.ids.numel()
        if feed is not None:
            ids[i, :k], positions[i, :k] = feed.ids, feed.positions
            if inputs is not None:
                inputs[i, :k] = feed.inputs
            mask[i, 0, :k, : feed.base] = 0
            mask[i, 0, :k, feed.base : length + k] = additive(feed.visible, dtype)
        pad = torch.arange(k, width, device=device)
        positions[i, k:] = length
        mask[i, 0, pad, length + pad] = 0  # a padding row sees itself
    try:
        out = step(ids, inputs, positions, mask, cache.cache)  # (hi, width, ...)
    finally:
        cache.end_pass()
    for i, feed in enumerate(feeds[:hi]):
        if feed is not None:
            cache.lengths[lo + i] += feed.ids.numel()
    return out
