"""Logits -> probabilities: temperature, top-k, softmax, top-p (the order transformers uses).

The same function warps the target's p and a drafter's q. Top-p reads only the head of each row: on the CPU first
the tokens within a fraction of the row's maximum (:mod:`specfamily.core.top_p_head`), else a bounded
``torch.topk``, widened (x4, up to the whole vocabulary) until the kept mass has been crossed for good; the kept
set is the one a full descending sort gives (ties in token order), with no full-vocabulary sort on the CPU.

On the CPU ``warp`` first hands the rows to the C++ warp (:mod:`specfamily.runtime.warp_rows`: the same dense ATen ops
and the threshold head in one loop, the same probabilities bit for bit in one call instead of about thirty); the rows
it does not settle, and every row where it is not built, take the torch path here (:func:`torch_warp`).
"""

from __future__ import annotations

import torch

from specfamily.core.top_p_head import threshold_head, threshold_heads
from specfamily.core.types import SamplingConfig
from specfamily.runtime.warp_rows import greedy_rows, warp_build, warp_rows

TOP_P_START = 64  # how many of the most probable tokens top-p reads first
WIDEN = 4  # how much the head grows when the first one did not settle a row


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of every row (the first of tied maxima, a NaN where there is one), as ``argmax(-1)`` gives it.

    Float32 CPU rows go to the C++ warp's vectorised ``greedy_rows`` (:mod:`specfamily.runtime.warp_rows`), the
    same indices; other rows, and every row without the build, through ``max(-1).indices``: the same indices in
    about a third of argmax's time on the CPU (torch 2.13). Greedy decoding takes one for every target pass."""
    if logits.dim() == 2:
        found = greedy_rows(logits)
        if found is not None:
            return found
    return logits.max(dim=-1).indices


def greedy_probs(logits: torch.Tensor) -> torch.Tensor:
    """One-hot at the argmax: p at temperature 0."""
    probs = torch.zeros_like(logits, dtype=torch.float32)
    return probs.scatter_(-1, greedy_tokens(logits).unsqueeze(-1), 1.0)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Mask everything below the k-th largest value; ties at the k-th value are kept."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(probs: torch.Tensor, top_p: float, start: int = TOP_P_START) -> torch.Tensor:
    """Keep the most probable tokens until their mass reaches top_p (the crossing token kept), renormalised.

    ``start``: how many tokens per row to read first (the warp passes top_k + 1); more are read when needed. The
    kept values are written into a zero row from the head (no vocabulary-wide mask or product), so the result is
    ``probs * top_p_keep(probs) / its sum`` bit for bit."""
    if top_p >= 1.0:
        return probs
    kept = top_p_rows(probs.reshape(-1, probs.shape[-1]), top_p, start, values=True).view(probs.shape)
    return kept.div_(kept.sum(dim=-1, keepdim=True))


def top_p_keep(probs: torch.Tensor, top_p: float, start: int = TOP_P_START) -> torch.Tensor:
    """(B, V) probabilities -> (B, V) bool: the tokens top-p keeps, row by row.

    A token is kept when the mass of the tokens before it (descending, ties in token order) is below top_p, that
    mass summed as a full sorted cumsum sums it (a CPU cumsum is sequential, so the head's prefix sums are the full
    ones bit for bit). Each row reads its k most probable tokens; a settled row (:func:`settled`) is done, the others
    read WIDEN times more, up to all V. On an accelerator the whole row is sorted at once (no host sync)."""
    return top_p_rows(probs, top_p, start, values=False)


def top_p_rows(probs: torch.Tensor, top_p: float, start: int, values: bool) -> torch.Tensor:
    """(B, V) -> (B, V): what top-p keeps of each row, as bools (``values`` False) or as the kept probabilities
    with 0 elsewhere (``values`` True; exactly ``probs * top_p_keep(probs)``), per :func:`top_p_keep`'s rule. On the
    CPU each row first tries its threshold head (:func:`specfamily.core.top_p_head.threshold_heads`); the rows it does
    not settle read a ``topk`` head of ``start`` tokens, widened until settled."""
    vocab = probs.shape[-1]
    k = vocab if probs.device.type != "cpu" else min(max(start, 1), vocab)
    if k == vocab:
        return head_keep(probs, k, top_p, values)[0]
    kept, pending = threshold_rows(probs, top_p, values)
    while pending.numel():  # the rows not settled yet; kept's other rows are final
        head, done = head_keep(probs[pending], k, top_p, values)
        kept[pending] = head
        pending = pending[~done]
        k = min(WIDEN * k, vocab)
    return kept


def threshold_rows(probs: torch.Tensor, top_p: float, values: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) on the CPU -> (B, V) kept (as :func:`top_p_rows`) for the rows their threshold heads settle, 0 / False
    in the others, and (P,) the indices of those other rows, ascending."""
    kept = probs.new_zeros(probs.shape) if values else torch.zeros(probs.shape, dtype=torch.bool)
    heads = (threshold_head if probs.shape[0] == 1 else threshold_heads)(probs, top_p)
    if heads is None:
        return kept, torch.arange(probs.shape[0])  # every row to the topk path
    kept.index_put_((heads.row, heads.token), heads.value * heads.keep if values else heads.keep)  # v * False: 0
    if heads.settled.numel() == probs.shape[0]:
        return kept, heads.settled[:0]
    pending = torch.ones(probs.shape[0], dtype=torch.bool)
    pending[heads.settled] = False
    return kept, pending.nonzero().view(-1)


def head_keep(probs: torch.Tensor, k: int, top_p: float, values: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p over the k most probable tokens of each row (b, V): (b, V) kept (bools, or with ``values`` the kept
    probabilities and 0 elsewhere), (b,) bool settled (all of them when k = V)."""
    head, indices = descending(probs, k)  # (b, k)
    cumulative = head.cumsum(dim=-1)
    keep_sorted = (cumulative - head) < top_p  # the mass before each token
    written = head.masked_fill(~keep_sorted, 0.0) if values else keep_sorted
    kept = written.new_zeros(probs.shape).scatter_(-1, indices, written)
    if k == probs.shape[-1]:
        return kept, keep_sorted.new_ones(probs.shape[0])
    return kept, settled(head, cumulative, keep_sorted, top_p)


def descending(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row (b, V), descending, and their indices: tied values in token order (on
    the CPU for k < V: it reads whether the head has ties)."""
    if k == probs.shape[-1]:
        return probs.sort(dim=-1, descending=True, stable=True)
    values, indices = probs.topk(k, dim=-1)  # (b, k): the head's values, its ties in no given order
    if not bool((values[:, 1:] == values[:, :-1]).any()):
        return values, indices  # no ties to order
    indices, by_token = indices.sort(dim=-1)
    values, order = values.gather(-1, by_token).sort(dim=-1, descending=True, stable=True)
    return values, indices.gather(-1, order)


def settled(values: torch.Tensor, cumulative: torch.Tensor, keep_sorted: torch.Tensor, top_p: float) -> torch.Tensor:
    """(b,) bool: whether a head of descending values (b, k), with its cumsum, decides its row's kept set.

    It does when (1) the head's mass exceeds top_p by more than a float cumsum's rounding (16 eps of the dtype):
    every token after the head then has a mass before it >= top_p; and (2) every kept value is larger than the
    head's last, so no token tied with a kept one lies outside the head."""
    crossed = cumulative[:, -1] >= top_p + 16 * torch.finfo(values.dtype).eps
    smallest_kept = values.masked_fill(~keep_sorted, float("inf")).amin(dim=-1)
    return crossed & (smallest_kept > values[:, -1])


def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities under ``sampling``."""
    if sampling.greedy:
        return greedy_probs(logits)
    native = native_warp(logits, sampling)
    return native if native is not None else torch_warp(logits, sampling)


def native_available() -> bool:
    """Whether the C++ warp is built here (``warp`` on the CPU then goes through it)."""
    return warp_build().available


def native_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor | None:
    """:func:`torch_warp`'s result bit for bit through the C++ warp, its unsettled rows through torch_warp; None
    for logits off the CPU, empty ones, or without the extension."""
    if logits.device.type != "cpu" or logits.numel() == 0 or logits.dim() == 0:
        return None
    rows = logits.float().reshape(-1, logits.shape[-1])
    result = warp_rows(rows, sampling.temperature, sampling.top_k, sampling.top_p)
    if result is None:
        return None
    probs, settled = result
    if not bool(settled.all()):
        pending = (~settled).nonzero().view(-1)
        probs[pending] = torch_warp(rows[pending], sampling)
    return probs.view(logits.shape)


def torch_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """``warp`` in torch ops (sampled ``sampling`` only): what the C++ warp reproduces, and the path of the rows it
    does not settle."""
    scaled = logits.float() / sampling.temperature
    probs = torch.softmax(top_k_filter(scaled, sampling.top_k), dim=-1)
    start = sampling.top_k + 1 if sampling.top_k > 0 else TOP_P_START
    return top_p_filter(probs, sampling.top_p, start)
