"""Medusa heads as plain torch modules: K residual blocks, each followed by a vocabulary projection.

Head k (k = 0 .. K-1) reads the target's feature at position t (the last hidden state after the final norm)
and predicts the token at position t + 2 + k; the target's own LM head on the same feature predicts t + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class HeadsShape:
    """What a set of heads is built from (and what a checkpoint records)."""

    num_heads: int  # K
    hidden_size: int  # H
    vocab_size: int  # V
    layers: int = 1  # residual blocks per head
    share_lm_head: bool = False  # project with the target's (frozen) LM head instead of per-head copies

    def __post_init__(self) -> None:
        for name in ("num_heads", "hidden_size", "vocab_size", "layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.share_lm_head, bool):
            raise TypeError(f"share_lm_head must be a bool, got {type(self.share_lm_head).__name__}")


class ResBlock(nn.Module):
    """x + SiLU(W x + b), zero-initialised so that it starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHead(nn.Module):
    """One head: ``layers`` residual blocks, then its own vocabulary projection (None when the LM head is shared)."""

    def __init__(self, shape: HeadsShape) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(ResBlock(shape.hidden_size) for _ in range(shape.layers)))
        self.proj = None if shape.share_lm_head else nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        h = self.blocks(x)
        return (self.proj if self.proj is not None else lm_head)(h)


class MedusaHeads(nn.Module):
    """K separate heads. ``forward(features (..., H)) -> logits (K, ..., V)``.

    With ``share_lm_head`` the target's LM head module is used for every head; it is held outside the module
    tree (so it is neither trained nor saved with the heads).
    """

    def __init__(self, shape: HeadsShape, lm_head: nn.Module | None = None) -> None:
        super().__init__()
        if shape.share_lm_head and lm_head is None:
            raise ValueError("share_lm_head=True needs the target's LM head")
        self.shape = shape
        self.heads = nn.ModuleList(MedusaHead(shape) for _ in range(shape.num_heads))
        self._lm_head = (lm_head,) if shape.share_lm_head else ()  # a tuple keeps it out of parameters()

    @property
    def lm_head(self) -> nn.Module | None:
        return self._lm_head[0] if self._lm_head else None

    def forward(self, features: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """Logits of the first ``num_heads`` heads (all by default): (k, ..., V).

        With a shared LM head all heads go through one projection call, which reads its weights once.
        """
        heads = self.heads if num_heads is None else self.heads[:num_heads]
        if self.lm_head is not None:
            return self.lm_head(torch.stack([head.blocks(features) for head in heads]))  # (k, ..., V)
        return torch.stack([head(features) for head in heads])


def build_heads(target, shape: HeadsShape) -> MedusaHeads:
    """Fresh heads for ``target``: identity residual blocks, projections copied from the target's LM head."""
    lm_head = target.model.get_output_embeddings()
    weight = lm_head.weight
    if tuple(weight.shape) != (shape.vocab_size, shape.hidden_size):
        raise ValueError(
            f"heads of shape (V={shape.vocab_size}, H={shape.hidden_size}) do not fit the target's LM head "
            f"{tuple(weight.shape)}"
        )
    if getattr(lm_head, "bias", None) is not None and not shape.share_lm_head:
        raise ValueError("the target's LM head has a bias; use share_lm_head=True for this target")
    heads = MedusaHeads(shape, lm_head)
    with torch.no_grad():
        for head in heads.heads:
            if head.proj is not None:
                head.proj.weight.copy_(weight.detach().to(head.proj.weight.dtype))
    return heads.to(device=weight.device, dtype=weight.dtype)


def shape_for(target, num_heads: int = 4, layers: int = 1, share_lm_head: bool = False) -> HeadsShape:
    """The heads shape that fits ``target``."""
    return HeadsShape(num_heads, target.hidden_size, target.vocab_size, layers, share_lm_head)
