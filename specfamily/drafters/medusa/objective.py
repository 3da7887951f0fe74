"""The Medusa heads' training loss: head k at position t predicts the token at t + 2 + k, weighted decay**k; and
the target's own choices as labels (cheap self-distillation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specfamily.drafters.medusa.heads import IGNORE_INDEX, MedusaHeads


def shifted(features: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels of head k: features at t (B, T - 2 - k, H) and the tokens at t + 2 + k (B, T - 2 - k)."""
    length = ids.shape[1] - 2 - k
    return features[:, :length], ids[:, 2 + k :]


def medusa_loss(heads: MedusaHeads, features: torch.Tensor, ids: torch.Tensor,
                decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """sum_k decay**k * CE(head k(features[:, t]), ids[:, t + 2 + k]); also each head's CE. features (B, T, H).

    Over a draft vocabulary, labels outside it are ignored (each head's CE is the mean over the others)."""
    total, per_head = features.new_zeros(()), []
    for k, head in enumerate(heads.heads):
        x, labels = shifted(features, ids, k)
        logits = head(x, heads.lm_head)  # (B, L, V or N)
        targets = heads.draft_index(labels.reshape(-1).to(logits.device))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets, ignore_index=IGNORE_INDEX,
                               reduction="sum") / (targets != IGNORE_INDEX).sum().clamp_min(1)
        total = total + decay**k * loss
        per_head.append(float(loss.detach()))
    return total, per_head


@torch.no_grad()
def argmax_labels(lm_head: torch.nn.Module, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, T) the target's own choice at every position: token t + 1 replaced by argmax of the LM head at t.

    Head k at t is then trained on the target's argmax for t + 2 + k (given the text up to t + 1 + k).
    """
    return torch.cat([ids[:, :1], lm_head(features[:, :-1]).argmax(dim=-1).to(ids.dtype)], dim=1)
