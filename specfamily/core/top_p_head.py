"""Top-p's head by a threshold instead of ``torch.topk``: every token within a factor of its row's largest probability.

On the CPU ``torch.topk`` of a 64-token head over a 49,152-token row costs about three softmaxes (it builds a queue
of every (value, index) pair). The tokens with p >= c, for c a fixed fraction of the row's maximum, are found from
the maxima of 64-token blocks (one reduction over the rows; only the blocks whose maximum reaches c are read again).
They are exactly the head a full descending sort puts first: every other token is smaller than each of them, so no
tie crosses the head's edge, and their sequential cumsum is the full sorted cumsum's prefix, bit for bit. When their
mass passes top_p (by the same rounding margin as :func:`specfamily.core.sampling.settled`), every token after them
has a mass before it >= top_p: the head decides the row. Otherwise the caller falls back to the bounded ``topk``.
A single row (what the lazy walk warps) takes :func:`threshold_head`, the fewest ops; a batch :func:`threshold_heads`,
all its rows in the same few ops (no per-row Python).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 64  # tokens per block whose maximum is read first; rows whose length it does not divide are not tried
RATIOS = (2.0**-10, 2.0**-16)  # thresholds tried on a batch, as fractions of each row's maximum; one row: the first
MOST = 4096  # a threshold head with more tokens than this is not sorted: the caller's topk path takes the row


@dataclass
class Heads:
    """The kept-set decisions of the rows of a batch that their threshold heads settle, one entry per head token:
    ``row`` (k,) its row in the batch, ``token`` (k,), ``value`` (k,) its probability, ``keep`` (k,) whether top-p
    keeps it; ``settled`` (R,) those rows (every other token of a settled row is not kept)."""

    row: torch.Tensor
    token: torch.Tensor
    value: torch.Tensor
    keep: torch.Tensor
    settled: torch.Tensor


def threshold_head(probs: torch.Tensor, top_p: float) -> Heads | None:
    """:func:`threshold_heads` of one row (1, V) with RATIOS[0] only, in the fewest ops; None when it does not settle
    the row."""
    if probs.shape[-1] % BLOCK or probs.shape[0] != 1:
        return None
    blocks = probs.reshape(-1, BLOCK)
    tops = blocks.amax(dim=1)  # (V / BLOCK,)
    c = float(tops.max()) * RATIOS[0]
    if not c > 0:  # NaN or an all-zero row
        return None
    chosen = (tops >= c).nonzero().view(-1)  # the blocks holding a token p >= c, in token order
    if chosen.numel() * BLOCK > 16 * MOST:
        return None
    picked = blocks[chosen]  # (b, BLOCK)
    where = (picked >= c).nonzero()  # (k, 2), in token order
    if where.shape[0] > MOST:
        return None
    values, order = picked[where[:, 0], where[:, 1]].sort(descending=True, stable=True)  # ties keep token order
    cumulative = values.cumsum(dim=0)  # sequential: the full sorted cumsum's prefix
    if not float(cumulative[-1]) >= top_p + 16 * torch.finfo(values.dtype).eps:
        return None
    where = where[order]
    tokens = chosen[where[:, 0]] * BLOCK + where[:, 1]
    return Heads(tokens.new_zeros(tokens.shape), tokens, values, (cumulative - values) < top_p, tokens.new_zeros(1))


def threshold_heads(probs: torch.Tensor, top_p: float) -> Heads | None:
    """For probabilities (B, V) on the CPU: the heads of the rows that a threshold head settles (the others are not
    in ``settled``); None when V is not a multiple of BLOCK."""
    if probs.shape[-1] % BLOCK or probs.dim() != 2:
        return None
    blocks = probs.reshape(probs.shape[0], -1, BLOCK)  # (B, V / BLOCK, BLOCK)
    tops = blocks.amax(dim=2)
    largest = tops.amax(dim=1, keepdim=True)  # (B, 1)
    rows, found = None, []  # None: every row of the batch
    for ratio in RATIOS:
        if rows is None:
            heads = _heads_above(blocks, tops, largest * ratio, top_p)
            rows = torch.arange(probs.shape[0])
        else:
            heads = _heads_above(blocks[rows], tops[rows], largest[rows] * ratio, top_p)
            heads.row, heads.settled = rows[heads.row], rows[heads.settled]
        found.append(heads)
        rows = rows[~torch.isin(rows, heads.settled)]
        if rows.numel() == 0:
            break
    return Heads(*(torch.cat([getattr(h, name) for h in found]) for name in ("row", "token", "value", "keep",
                                                                             "settled")))


def _heads_above(blocks: torch.Tensor, tops: torch.Tensor, c: torch.Tensor, top_p: float) -> Heads:
    """The heads p >= c (c (R, 1), per row) of the rows (R, V / BLOCK, BLOCK) that they settle; rows local to these.
    A row whose head is longer than MOST (a flat row: the topk path reads it faster) or empty (NaN) is not settled."""
    chosen = (tops >= c).nonzero()  # (b, 2): (row, block), rows ascending, blocks in token order
    picked = blocks[chosen[:, 0], chosen[:, 1]]  # (b, BLOCK)
    where = (picked >= c[chosen[:, 0]]).nonzero()  # (k, 2): (picked block, offset), in (row, token) order
    row = chosen[where[:, 0], 0]
    counts = torch.bincount(row, minlength=blocks.shape[0])
    if where.shape[0] and int(counts.max()) > MOST:
        short = counts[row] <= MOST
        where, row, counts = where[short], row[short], counts.masked_fill(counts > MOST, 0)
    values = picked[where[:, 0], where[:, 1]]
    tokens = chosen[where[:, 0], 1] * BLOCK + where[:, 1]
    order = values.sort(descending=True, stable=True).indices  # ties keep (row, token) order
    order = order[row[order].sort(stable=True).indices]  # grouped by row, each row descending
    row, values, tokens = row[order], values[order], tokens[order]
    slot = torch.arange(row.numel()) - (counts.cumsum(0) - counts)[row]  # each value's place in its row's head
    head = values.new_zeros(blocks.shape[0], int(counts.max()) if row.numel() else 0)
    head[row, slot] = values
    cumulative = head.cumsum(dim=1)  # per row, sequential: the full sorted cumsum's prefix (padding adds 0 after it)
    done = (counts > 0) & (cumulative[:, -1] >= top_p + 16 * torch.finfo(head.dtype).eps) if row.numel() else counts > 0
    keep = (cumulative - head)[row, slot] < top_p  # the mass before each token
    mine = done[row]
    return Heads(row[mine], tokens[mine], values[mine], keep[mine], done.nonzero().view(-1))
