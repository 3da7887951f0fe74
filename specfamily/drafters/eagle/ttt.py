"""EAGLE-3's training-time test (TTT): the draft unrolled over its own outputs, scored against the target at every step.

A window x[0 .. T-1] gives L = T - 1 pairs (g[t], x[t + 1]), g the fused target feature. Step s reads its own step
s - 1 output at t with the token x[t + 1 + s] and predicts x[t + 2 + s], at rotary position t + s; its query at t
reads the step-0 keys of indices j <= t - s and the keys of steps 1 .. s at t itself (:func:`unrolled_visible`), as
the reference trainers do. Nothing past t is read.

Loss of step s: cross-entropy against the target's distribution of x[t + 2 + s] restricted to the draft vocabulary
and renormalised, where the target's argmax is inside it; total = sum_s decay^s * loss_s (decay 0.8). Accuracy of
step s: the share of those indices whose draft argmax is the target's. Simulated acceptance length:
1 + sum_k prod_{s <= k} acc_s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specfamily.core.tree_mask import additive
from specfamily.drafters.eagle.model3 import Eagle3Model

DEFAULT_TTT_LENGTH = 7  # the reference's unrolled steps
DEFAULT_DECAY = 0.8  # the reference's step weights: decay ** s


@dataclass
class TTTResult:
    """One batch's objective: the weighted loss and, per step, its loss, top-1 hits and scored positions."""

    loss: torch.Tensor  # scalar, differentiable
    step_losses: torch.Tensor  # (K,) detached
    hits: torch.Tensor  # (K,) long
    counts: torch.Tensor  # (K,) long


def step_weights(length: int, decay: float = DEFAULT_DECAY) -> list[float]:
    return [decay**s for s in range(length)]


def simulated_acceptance(accuracies: Sequence[float] | torch.Tensor) -> float:
    """1 + sum over k of the product of the per-step accuracies up to k: the expected tokens per target pass of a
    chain whose step s is accepted with probability acc_s given the steps before it were."""
    acc = torch.as_tensor(accuracies, dtype=torch.float64)
    return float(1.0 + torch.cumprod(acc, dim=0).sum())


def unrolled_visible(length: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(L, (step + 1) * L) bool: what the queries of unrolled step ``step`` read in the cache of steps 0 .. step
    (step-major keys): the step-0 keys j <= t - step, then for each later step k its key at t alone."""
    index = torch.arange(length, device=device)
    first = index[None, :] <= index[:, None] - step
    diagonal = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([first] + [diagonal] * step, dim=1)


@torch.no_grad()
def target_pass(target_model: PreTrainedModel, windows: torch.Tensor,
                layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, k * H) the target's features of ``layers`` (transformers' hidden_states indexing) and (B, T, V)
    logits of the frozen target over ``windows`` (B, T)."""
    out = target_model(input_ids=windows.to(target_model.device), output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), out.logits


def unroll(model: Eagle3Model, windows: torch.Tensor, features: torch.Tensor, ttt_length: int) -> list[torch.Tensor]:
    """The layer's outputs (B, T - 1, H) of each of ``ttt_length`` unrolled steps over ``windows`` (B, T) and the
    target's layer features (B, T, k * H)."""
    batch, length = windows.shape[0], windows.shape[1] - 1
    windows = windows.to(features.device)
    hidden = model.fuse(features[:, :length])
    cache, outputs = DynamicCache(), []
    for step in range(ttt_length):
        positions = (torch.arange(length, device=features.device) + step).expand(batch, -1)
        mask = additive(unrolled_visible(length, step, features.device), hidden.dtype)[None, None]
        tail = windows[:, 1 + step :]  # the token each index reads: x[t + 1 + step], 0 past the window (never scored)
        tokens = torch.cat([tail, tail.new_zeros(batch, length - tail.shape[1])], dim=1)
        hidden = model(tokens, hidden, positions, mask, cache)
        outputs.append(hidden)
    return outputs


def ttt_objective(model: Eagle3Model, windows: torch.Tensor, features: torch.Tensor, logits: torch.Tensor,
                  ttt_length: int = DEFAULT_TTT_LENGTH, decay: float = DEFAULT_DECAY) -> TTTResult:
    """The TTT loss over ``windows`` (B, T) from the target's features (B, T, k * H) and logits (B, T, V)."""
    if windows.shape[1] < ttt_length + 2:
        raise ValueError(f"windows of {windows.shape[1]} tokens are too short for {ttt_length} unrolled steps "
                         f"(need >= {ttt_length + 2})")
    length = windows.shape[1] - 1
    inside = None
    if model.vocab is not None:
        inside = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        inside[model.vocab.ids.to(logits.device)] = True
    total, losses, hits, counts = logits.new_zeros((), dtype=torch.float32), [], [], []
    for step, out in enumerate(unroll(model, windows, features, ttt_length)):
        n = length - step  # indices t with a target: t + 1 + step <= T - 1
        loss, hit = _step_terms(model, out[:, :n], logits[:, 1 + step :].float(), inside)
        total = total + decay**step * loss
        losses.append(loss.detach())
        hits.append(hit)
        counts.append(out.shape[0] * n)
    return TTTResult(total, torch.stack(losses), torch.stack(hits), torch.tensor(counts))


def _step_terms(model: Eagle3Model, out: torch.Tensor, target_logits: torch.Tensor,
                inside: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, hits) of one step: soft-label cross-entropy over the draft vocabulary where the target's argmax is
    inside it; top-1 hits against the target's argmax."""
    log_q = F.log_softmax(model.logits(out).float(), dim=-1)  # (B, n, N)
    with torch.no_grad():
        best = target_logits.argmax(-1)
        restricted = target_logits if model.vocab is None else target_logits[..., model.vocab.ids]
        p = F.softmax(restricted, dim=-1)
        scored = torch.ones_like(best, dtype=torch.bool) if inside is None else inside[best]
    loss = -((p * log_q).sum(-1) * scored).sum() / best.numel()
    hit = ((model.token_ids(log_q.argmax(-1)) == best) & scored).sum()
    return loss, hit.detach()


class TTTLoss(nn.Module):
    """The objective as a module over the drafter (what DistributedDataParallel wraps): forward(windows, features,
    logits) -> :class:`TTTResult`."""

    def __init__(self, model: Eagle3Model, ttt_length: int = DEFAULT_TTT_LENGTH, decay: float = DEFAULT_DECAY):
        super().__init__()
        self.model, self.ttt_length, self.decay = model, ttt_length, decay

    def forward(self, windows: torch.Tensor, features: torch.Tensor, logits: torch.Tensor) -> TTTResult:
        return ttt_objective(self.model, windows, features, logits, self.ttt_length, self.decay)


@torch.no_grad()
def heldout_accuracies(model: Eagle3Model, target_model: PreTrainedModel, windows: torch.Tensor,
                       ttt_length: int = DEFAULT_TTT_LENGTH, batch: int = 8) -> tuple[list[float], float]:
    """Per-step top-1 accuracies on fixed held-out ``windows`` (target features computed here) and the mean
    weighted loss."""
    hits = counts = 0
    loss, rows = 0.0, 0
    for chunk in windows.split(batch):
        features, logits = target_pass(target_model, chunk, model.shape.layers)
        result = ttt_objective(model, chunk, features, logits, ttt_length)
        hits, counts = hits + result.hits.cpu(), counts + result.counts
        loss, rows = loss + float(result.loss) * chunk.shape[0], rows + chunk.shape[0]
    return (hits.double() / counts.clamp_min(1)).tolist(), loss / max(rows, 1)
