"""Medusa heads as plain torch modules: K residual blocks, each followed by a vocabulary projection.

Head k reads the target's final-norm feature at position t and predicts the token at t + 2 + k. With a reduced draft
vocabulary (FR-Spec, ``HeadsShape.draft_vocab = N > 0``) head logits are (..., N) over draft indices and
``MedusaHeads.token_ids`` (a persistent int64 buffer) maps them to target ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.drafters.shared.placement import built_like

IGNORE_INDEX = -100  # cross-entropy label of a target token outside the draft vocabulary


@dataclass(frozen=True)
class HeadsShape:
    """What a set of heads is built from (and what a checkpoint records)."""

    num_heads: int  # K
    hidden_size: int  # H
    vocab_size: int  # V
    layers: int = 1  # residual blocks per head
    share_lm_head: bool = False  # project with the target's (frozen) LM head instead of per-head copies
    draft_vocab: int = 0  # N > 0: heads score only N target ids (a reduced draft vocabulary); 0 = all V

    def __post_init__(self) -> None:
        for name in ("num_heads", "hidden_size", "vocab_size", "layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.share_lm_head, bool):
            raise TypeError(f"share_lm_head must be a bool, got {type(self.share_lm_head).__name__}")
        value = self.draft_vocab
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= self.vocab_size:
            raise ValueError(f"draft_vocab must be an integer in 0..{self.vocab_size} (0 = the full vocabulary), "
                             f"got {value!r}")

    @property
    def output_size(self) -> int:
        """Width of the heads' logits: N over a draft vocabulary, else V."""
        return self.draft_vocab or self.vocab_size


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
        self.proj = None if shape.share_lm_head else nn.Linear(shape.hidden_size, shape.output_size, bias=False)

    def forward(self, x: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        h = self.blocks(x)
        return (self.proj if self.proj is not None else lm_head)(h)


class SubsetHead(nn.Module):
    """A frozen (N, H) projection: the target LM head's rows for a draft vocabulary (a buffer, never saved)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)


class HeadSet(nn.Module):
    """What Medusa's and Hydra's heads share: the shape, K head modules, the draft vocabulary (its ids are the
    ``draft_ids`` buffer) and the shared projection.

    With ``share_lm_head`` the target's LM head module is used for every head; it is held outside the module
    tree (so it is neither trained nor saved with the heads). With ``share_lm_head`` and a draft vocabulary the
    shared projection is a frozen copy of the target head's rows for the draft ids (``SubsetHead``, not saved).
    ``vocab`` (a DraftVocab) is required when ``shape.draft_vocab > 0``.
    """

    def __init__(self, shape: HeadsShape, heads: list[nn.Module], lm_head: nn.Module | None = None,
                 vocab: DraftVocab | None = None) -> None:
        super().__init__()
        if shape.share_lm_head and lm_head is None:
            raise ValueError("share_lm_head=True needs the target's LM head")
        check_vocab(shape, vocab)
        self.shape = shape
        self.vocab = vocab if shape.draft_vocab else None
        self.heads = nn.ModuleList(heads)
        if self.vocab is not None:
            self.register_buffer("draft_ids", self.vocab.ids.clone())  # (N,) int64, saved with the heads
            if shape.share_lm_head:
                lm_head = SubsetHead(self.vocab.head_rows(lm_head))
                self.subset_head = lm_head  # a submodule: moves with the heads; its buffer is not saved
        self._lm_head = (lm_head,) if shape.share_lm_head else ()  # a tuple keeps it out of parameters()

    @property
    def lm_head(self) -> nn.Module | None:
        """The shared projection (the target's LM head, or its draft-vocabulary rows), or None."""
        return self._lm_head[0] if self._lm_head else None

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Target token ids of indices into the heads' logits (identity over the full vocabulary)."""
        return index if self.vocab is None else self.draft_ids[index.to(self.draft_ids.device)].to(index.device)

    def draft_index(self, tokens: torch.Tensor, missing: int = IGNORE_INDEX) -> torch.Tensor:
        """Indices into the heads' logits of target ``tokens`` (any shape); ``missing`` outside the draft vocabulary
        (cross-entropy's ignore_index by default). The identity over the full vocabulary."""
        if self.vocab is None:
            return tokens
        ids = self.draft_ids.to(tokens.device)
        index = torch.searchsorted(ids, tokens.contiguous()).clamp_max(ids.numel() - 1)
        return torch.where(ids[index] == tokens, index, torch.full_like(index, missing))

    def project(self, hidden: torch.Tensor, head: nn.Module | None = None, linear=None) -> torch.Tensor:
        """Logits of ``hidden`` by ``head``'s own projection, else by the shared one (``linear``, when drafting:
        ``specfamily.runtime.matmul``'s product in place of the module's own call)."""
        if head is not None and head.proj is not None:
            return head.proj(hidden)
        if linear is not None and type(self.lm_head) in (nn.Linear, SubsetHead):
            return linear(hidden, self.lm_head.weight, getattr(self.lm_head, "bias", None))
        return self.lm_head(hidden)


class MedusaHeads(HeadSet):
    """K separate heads. ``forward(features (..., H)) -> logits (K, ..., V)``, or (K, ..., N) over a draft vocabulary
    (the projections: :class:`HeadSet`)."""

    def __init__(self, shape: HeadsShape, lm_head: nn.Module | None = None, vocab: DraftVocab | None = None) -> None:
        super().__init__(shape, [MedusaHead(shape) for _ in range(shape.num_heads)], lm_head, vocab)

    @classmethod
    def for_target(cls, target, shape: HeadsShape, vocab: DraftVocab | None) -> MedusaHeads:
        return cls(shape, target.model.get_output_embeddings(), vocab)

    def forward(self, features: torch.Tensor, num_heads: int | None = None, *, linear=None) -> torch.Tensor:
        """Logits of the first ``num_heads`` heads (all by default): (k, ..., V); (k, ..., N) over draft ids.

        With a shared LM head all heads go through one projection call, which reads its weights once; ``linear``
        (``specfamily.runtime.matmul``, when drafting) multiplies by its weight instead of the module's own call.
        """
        heads = self.heads if num_heads is None else list(self.heads)[:num_heads]  # slicing a ModuleList builds one
        if self.lm_head is not None:
            return self.project(torch.stack([head.blocks(features) for head in heads]), linear=linear)  # (k, ..., V)
        return torch.stack([head(features) for head in heads])


def check_vocab(shape: HeadsShape, vocab: DraftVocab | None) -> None:
    """A draft vocabulary must be given exactly when the shape asks for one, of its size, over its V."""
    if not shape.draft_vocab:
        if vocab is not None:
            raise ValueError("a draft vocabulary was given for heads of shape draft_vocab=0 (the full vocabulary)")
        return
    if vocab is None:
        raise ValueError(f"heads of shape draft_vocab={shape.draft_vocab} need their draft vocabulary (the ids)")
    if vocab.size != shape.draft_vocab or vocab.vocab_size != shape.vocab_size:
        raise ValueError(f"a draft vocabulary of {vocab.size} ids over {vocab.vocab_size} tokens does not fit heads "
                         f"of shape draft_vocab={shape.draft_vocab}, vocab_size={shape.vocab_size}")


def build_heads(target, shape: HeadsShape, vocab: DraftVocab | None = None, heads_class: type = MedusaHeads):
    """Fresh heads for ``target`` (``heads_class``: MedusaHeads, or another :class:`HeadSet` with ``for_target``),
    blocks that start as the identity, projections copied from the target's LM head (its rows for ``vocab``'s ids
    when the shape has a draft vocabulary)."""
    lm_head = target.model.get_output_embeddings()
    weight = lm_head.weight
    if tuple(weight.shape) != (shape.vocab_size, shape.hidden_size):
        raise ValueError(
            f"heads of shape (V={shape.vocab_size}, H={shape.hidden_size}) do not fit the target's LM head "
            f"{tuple(weight.shape)}"
        )
    if getattr(lm_head, "bias", None) is not None and not shape.share_lm_head:
        raise ValueError("the target's LM head has a bias; use share_lm_head=True for this target")
    with built_like(weight.device, weight.dtype):  # on the target's device in its dtype, never a host copy first
        heads = heads_class.for_target(target, shape, vocab)
    rows = weight.detach() if heads.vocab is None else heads.vocab.head_rows(lm_head)
    with torch.no_grad():
        for head in heads.heads:
            if head.proj is not None:
                head.proj.weight.copy_(rows.to(head.proj.weight.dtype))
    return heads.to(device=weight.device, dtype=weight.dtype)


def shape_for(target, num_heads: int = 4, layers: int = 1, share_lm_head: bool = False,
              draft_vocab: int = 0) -> HeadsShape:
    """The heads shape that fits ``target`` (``draft_vocab`` N > 0: over N of its ids)."""
    return HeadsShape(num_heads, target.hidden_size, target.vocab_size, layers, share_lm_head, draft_vocab)
