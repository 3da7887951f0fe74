"""Top-p's head by a threshold instead of ``torch.topk``: every token within a factor of the row's largest probability.

On the CPU ``torch.topk`` of a 64-token head over a 49,152-token row costs about three softmaxes (it builds a queue
of every (value, index) pair). The tokens with p >= c, for c a fixed fraction of the row's maximum, are found from
the maxima of 64-token blocks (one reduction over the row; only the blocks whose maximum reaches c are read again).
They are exactly the head a full descending sort puts first: every other token is smaller than each of them, so no
tie crosses the head's edge, and their sequential cumsum is the full sorted cumsum's prefix, bit for bit. When their
mass passes top_p (by the same rounding margin as :func:`specfamily.core.sampling.settled`), every token after them
has a mass before it >= top_p: the head decides the row. Otherwise the caller falls back to the bounded ``topk``.
"""

from __future__ import annotations

import torch

BLOCK = 64  # tokens per block whose maximum is read first; rows whose length it does not divide are not tried
RATIOS = (2.0**-8, 2.0**-16)  # thresholds tried, as fractions of the row's maximum
MOST = 4096  # a threshold head with more tokens than this is not sorted: the caller's topk path takes the row


def threshold_head(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """For one row of probabilities (V,) on the CPU: (values (k,) descending, ties in token order; their token
    indices (k,); keep (k,) bool: what top-p keeps of them) when the head of the tokens within RATIOS of the row's
    maximum decides top-p's kept set; None when no such head does (V not a multiple of BLOCK, a flat row, NaN)."""
    if probs.shape[-1] % BLOCK or probs.dim() != 1:
        return None
    blocks = probs.view(-1, BLOCK)
    tops = blocks.amax(dim=1)  # (V / BLOCK,)
    largest = float(tops.max())
    margin = top_p + 16 * torch.finfo(probs.dtype).eps
    for ratio in RATIOS:
        head = _head_above(blocks, tops, largest * ratio)
        if head is None:
            return None
        values, cumulative, chosen, where = head
        if float(cumulative[-1]) >= margin:  # every token after the head has a mass before it >= top_p
            return values, chosen[where[:, 0]] * BLOCK + where[:, 1], (cumulative - values) < top_p
    return None


def _head_above(blocks: torch.Tensor, tops: torch.Tensor, c: float) -> tuple[torch.Tensor, ...] | None:
    """The tokens of p >= c (c > 0): (their values (k,) sorted descending with ties in token order, the values'
    cumsum (k,), the blocks read (b,), each value's (block of those, offset) (k, 2)); None when there are none (a
    NaN row) or more than MOST."""
    if not c > 0:
        return None
    chosen = (tops >= c).nonzero().view(-1)  # the blocks holding such a token, in token order
    if chosen.numel() == 0 or chosen.numel() * BLOCK > 16 * MOST:
        return None
    rows = blocks[chosen]  # (b, BLOCK)
    where = (rows >= c).nonzero()  # (k, 2), in token order
    if where.shape[0] > MOST:
        return None
    values, order = rows[where[:, 0], where[:, 1]].sort(descending=True, stable=True)  # ties keep token order
    return values, values.cumsum(dim=0), chosen, where[order]
