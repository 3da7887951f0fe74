"""The Medusa heads' training loss: head k at position t predicts the token at t + 2 + k, weighted decay**k; and
the target's own choices as labels (cheap self-distillation).

Two objectives (``objective`` in the trainers' configs): ``ce``, cross-entropy on the one label at t + 2 + k, and
``distill`` (Hydra++'s teacher distillation, Ankner et al. 2024), KL(p || q_k) between the target's own next-token
distribution p at t + 1 + k (the one that chose the token at t + 2 + k) and head k's q_k at t. Over a draft
vocabulary p is restricted to it and renormalised (the softmax of the target's logits at the draft ids).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specfamily.drafters.medusa.heads import IGNORE_INDEX, MedusaHeads
from specfamily.drafters.shared.draft_vocab import DraftVocab

OBJECTIVES = ("ce", "distill")


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


def medusa_logits(heads: MedusaHeads, features: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    """Entry k: head k's logits (B, T - 2 - k, V or N) at every t with a token at t + 2 + k."""
    return [head(shifted(features, ids, k)[0], heads.lm_head) for k, head in enumerate(heads.heads)]


@torch.no_grad()
def target_logits(lm_head: torch.nn.Module, features: torch.Tensor, vocab: DraftVocab | None = None) -> torch.Tensor:
    """(B, T, V or N) the target's next-token logits at every position; over a draft vocabulary only its rows (their
    softmax is the target's distribution restricted to the draft ids and renormalised)."""
    if vocab is None:
        return lm_head(features)
    return F.linear(features, vocab.head_rows(lm_head).to(features.device, features.dtype))


def kl_to_logits(p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of KL(p || softmax(logits)): p and logits (..., N); p's zeros contribute nothing."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    return (torch.special.xlogy(p, p) - p * log_q).sum(dim=-1).mean()


def distill_loss(logits: list[torch.Tensor], teacher: torch.Tensor, decay: float = 0.8,
                 temperature: float = 1.0) -> tuple[torch.Tensor, list[float]]:
    """sum_k decay**k * tau**2 KL(p(. | x_<=t+1+k) / tau || q_k(. | t) / tau); also each head's term.

    ``logits[k]`` (B, L_k, N): head k at t = 0 .. L_k - 1; ``teacher`` (B, T, N): the target's logits at every
    position (row j is its distribution of token j + 1), so head k at t is matched to row t + 1 + k. The gradient
    in q_k is p - q_k (times tau): zero where a head already equals the target; with a one-hot p the term is the
    cross-entropy on its label."""
    total, per_head = teacher.new_zeros((), dtype=torch.float32), []
    for k, z in enumerate(logits):
        p = F.softmax(teacher[:, 1 + k : 1 + k + z.shape[1]].float() / temperature, dim=-1)
        loss = kl_to_logits(p, z / temperature) * temperature**2
        total = total + decay**k * loss
        per_head.append(float(loss.detach()))
    return total, per_head


HeadsLogits = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], list[torch.Tensor]]


def distill_objective(head_logits: HeadsLogits, lm_head: torch.nn.Module, temperature: float = 1.0):
    """A trainer loss ``(heads, features, ids, decay) -> (loss, per-head KL)`` distilling the target's distributions
    (its LM head ``lm_head`` over the same features) into the heads' logits (``head_logits``: Medusa's or Hydra's
    teacher-forced logits)."""

    def loss(heads, features: torch.Tensor, ids: torch.Tensor, decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
        teacher = target_logits(lm_head, features, heads.vocab)
        return distill_loss(head_logits(heads, features, ids), teacher, decay, temperature)

    return loss


@torch.no_grad()
def argmax_labels(lm_head: torch.nn.Module, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, T) the target's own choice at every position: token t + 1 replaced by argmax of the LM head at t.

    Head k at t is then trained on the target's argmax for t + 2 + k (given the text up to t + 1 + k).
    """
    return torch.cat([ids[:, :1], lm_head(features[:, :-1]).argmax(dim=-1).to(ids.dtype)], dim=1)
