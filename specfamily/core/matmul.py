"""How the lean forwards multiply a few rows by a weight matrix: ``exact`` (transformers' own F.linear) or ``skinny``.

A decode step or a verify pass multiplies 1 to a few rows by every weight matrix of the model. F.linear computes
x @ W^T; on a CPU, MKL runs one row as a matrix-vector product and 2-8 rows with a general kernel, and on some
CPUs both read the weights at a fraction of the memory bandwidth (measured on an AMD EPYC, 2 threads, SmolLM2's
1536 x 576 MLP weights: 313 us for one row, 478 us for two). ``skinny_linear`` computes the same product as
(W @ x^T)^T, which MKL runs with the weight as the long side (124 us for one row, padded to two; 116 us for two).

The two orders sum in float32 differently, so ``skinny`` logits differ from transformers' in the last bits (the
same kind of difference as between two BLAS libraries): greedy text can differ only where two tokens' logits tie
to float rounding. ``exact`` stays bit-identical to transformers' forward. ``auto`` times both on the model's own
weights once, on this machine and thread count, and takes ``skinny`` when it is clearly faster (float32 on a CPU).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MATMUL_KINDS", "SKINNY_MAX_ROWS", "linear_for", "resolve_matmul", "skinny_linear"]

MATMUL_KINDS = ("exact", "skinny", "auto")
SKINNY_MAX_ROWS = 8  # measured on SmolLM2 (2 threads): past 8 rows F.linear's own kernel is as fast or faster
AUTO_MARGIN = 0.85  # skinny must take at most this share of exact's time to be chosen
AUTO_BYTES = 64 << 20  # weights timed by auto: more than a CPU's last-level cache, as a real pass reads them
AUTO_ROUNDS = 3

Linear = Callable[..., torch.Tensor]  # (x, weight, bias=None) -> x @ weight^T + bias


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, max_rows: int | None = SKINNY_MAX_ROWS
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as (weight @ x^T)^T for at most ``max_rows`` rows of x (None: any).

    One row is fed twice (a single column would take the matrix-vector kernel again); the result is contiguous,
    as F.linear's is. More rows go to F.linear.
    """
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if rows == 0 or (max_rows is not None and rows > max_rows) or weight.dim() != 2:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    columns = torch.cat((flat, flat)) if rows == 1 else flat
    out = torch.mm(weight, columns.t()).t()[:rows].contiguous()
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.shape[0])


def linear_for(kind: str) -> Linear:
    """The linear function of a resolved kind (``exact`` or ``skinny``)."""
    if kind == "exact":
        return F.linear
    if kind == "skinny":
        return skinny_linear
    raise ValueError(f"matmul must be 'exact' or 'skinny' once resolved, got {kind!r}")


def resolve_matmul(kind: str, model: nn.Module | None) -> str:
    """``exact`` or ``skinny`` for ``model``: the kind asked for, or for ``auto`` the one measured to be faster here.

    ``model`` None: nothing will multiply with the choice (no lean forward), so it is ``exact`` whatever was asked.
    """
    if kind not in MATMUL_KINDS:
        raise ValueError(f"matmul must be one of {MATMUL_KINDS}, got {kind!r}")
    if model is None:
        return "exact"
    if kind != "auto":
        return kind
    weights = timed_weights(model)
    if not weights or weights[0].device.type != "cpu" or weights[0].dtype != torch.float32:
        return "exact"
    exact, skinny = one_row_seconds(weights)
    return "skinny" if skinny <= AUTO_MARGIN * exact else "exact"


def timed_weights(model: nn.Module, budget: int = AUTO_BYTES) -> list[torch.Tensor]:
    """The model's linear weights in module order, up to ``budget`` bytes (at least one)."""
    weights, total = [], 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and total < budget:
            weights.append(module.weight)
            total += module.weight.numel() * module.weight.element_size()
    return weights


@torch.inference_mode()
def one_row_seconds(weights: Sequence[torch.Tensor], rounds: int = AUTO_ROUNDS) -> tuple[float, float]:
    """Median seconds of one row through every weight, (F.linear, skinny_linear), the two interleaved by round."""
    rows = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w in weights}
    times: dict[Linear, list[float]] = {F.linear: [], skinny_linear: []}
    for round_ in range(rounds + 1):  # round 0 warms both up
        for linear, seconds in times.items():
            start = time.perf_counter()
            for weight in weights:
                linear(rows[weight.shape[1]], weight)
            if round_:
                seconds.append(time.perf_counter() - start)
    return statistics.median(times[F.linear]), statistics.median(times[skinny_linear])
