"""Hydra heads (Ankner et al. 2024, the base MLP variant): Medusa heads made sequentially dependent.

Head k reads the target's final-norm feature at position t concatenated with the input embeddings of the k + 1 tokens
after it, x_{t+1} .. x_{t+1+k}, and predicts x_{t+2+k}. At decode time t is the position before the root (R - 1),
x_{t+1} is the root and x_{t+2} .. are the tokens drafted above the node being expanded: each head conditions on
what was drafted before it. Shapes, draft vocabulary and the shared LM head are Medusa's (:class:`HeadsShape`);
the embedding table is the target's (frozen, held outside the module tree like a shared LM head).

Head k: a grounding block ``R x + SiLU(W x + b)`` over the ((k + 2) H) input, R initialised to pick the feature
(so an untrained Hydra head is an untrained Medusa head), then ``layers - 1`` residual blocks, then the projection.
"""

from __future__ import annotations

import torch
from torch import nn

from specfamily.drafters.medusa.heads import HeadsShape, ResBlock, SubsetHead, check_vocab
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.drafters.shared.placement import built_like


class GroundBlock(nn.Module):
    """``R x + SiLU(W x + b)`` from (k + 2) H inputs to H: R starts as [I, 0, ...], W and b as zero."""

    def __init__(self, hidden_size: int, inputs: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size * inputs, hidden_size)
        self.res = nn.Linear(hidden_size * inputs, hidden_size, bias=False)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.zero_()
            self.res.weight.zero_()
            self.res.weight[:, :hidden_size].copy_(torch.eye(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res(x) + nn.functional.silu(self.linear(x))


class HydraHead(nn.Module):
    """Head k: the grounding block over k + 2 inputs, ``layers - 1`` residual blocks, its projection (or None)."""

    def __init__(self, shape: HeadsShape, k: int) -> None:
        super().__init__()
        blocks = [GroundBlock(shape.hidden_size, k + 2)]
        blocks += [ResBlock(shape.hidden_size) for _ in range(shape.layers - 1)]
        self.blocks = nn.Sequential(*blocks)
        self.proj = None if shape.share_lm_head else nn.Linear(shape.hidden_size, shape.output_size, bias=False)


class HydraHeads(nn.Module):
    """K sequentially dependent heads over a frozen target's feature and input embeddings.

    ``head_logits(k, x)``: logits (..., V or N) of head k for inputs x (..., (k + 2) H) already concatenated.
    ``forward(features (B, T, H), ids (B, T))``: teacher-forced logits, a list over k of (B, T - 2 - k, V or N).
    """

    def __init__(self, shape: HeadsShape, embed: nn.Module, lm_head: nn.Module | None = None,
                 vocab: DraftVocab | None = None) -> None:
        super().__init__()
        if shape.share_lm_head and lm_head is None:
            raise ValueError("share_lm_head=True needs the target's LM head")
        check_vocab(shape, vocab)
        self.shape = shape
        self.vocab = vocab if shape.draft_vocab else None
        self.heads = nn.ModuleList(HydraHead(shape, k) for k in range(shape.num_heads))
        if self.vocab is not None:
            self.register_buffer("draft_ids", self.vocab.ids.clone())  # (N,) int64, saved with the heads
            if shape.share_lm_head:
                lm_head = SubsetHead(self.vocab.head_rows(lm_head))
                self.subset_head = lm_head  # moves with the heads; its buffer is not saved
        self._lm_head = (lm_head,) if shape.share_lm_head else ()  # tuples keep the target's modules out of
        self._embed = (embed,)  # parameters() and the state dict

    @property
    def lm_head(self) -> nn.Module | None:
        return self._lm_head[0] if self._lm_head else None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., H) the target's input embeddings of target token ids (no gradient: the table is frozen)."""
        with torch.no_grad():
            return self._embed[0](tokens)

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Target token ids of indices into the heads' logits (identity over the full vocabulary)."""
        return index if self.vocab is None else self.draft_ids[index.to(self.draft_ids.device)].to(index.device)

    def draft_index(self, tokens: torch.Tensor, missing: int = -100) -> torch.Tensor:
        """Indices into the heads' logits of target ``tokens``; ``missing`` outside the draft vocabulary."""
        if self.vocab is None:
            return tokens
        ids = self.draft_ids.to(tokens.device)
        index = torch.searchsorted(ids, tokens.contiguous()).clamp_max(ids.numel() - 1)
        return torch.where(ids[index] == tokens, index, torch.full_like(index, missing))

    def head_logits(self, k: int, x: torch.Tensor, linear=None) -> torch.Tensor:
        """Logits of head k for concatenated inputs x (..., (k + 2) H); ``linear`` multiplies a shared head."""
        head = self.heads[k]
        hidden = head.blocks(x)
        if head.proj is not None:
            return head.proj(hidden)
        if linear is not None and type(self.lm_head) in (nn.Linear, SubsetHead):
            return linear(hidden, self.lm_head.weight, getattr(self.lm_head, "bias", None))
        return self.lm_head(hidden)

    def forward(self, features: torch.Tensor, ids: torch.Tensor, num_heads: int | None = None) -> list[torch.Tensor]:
        """Teacher-forced logits: entry k is (B, T - 2 - k, V or N), head k at t given x_{t+1} .. x_{t+1+k}."""
        t = ids.shape[1]
        emb = self.embed(ids).to(features.dtype)  # (B, T, H)
        out = []
        for k in range(self.shape.num_heads if num_heads is None else num_heads):
            length = t - 2 - k
            parts = [features[:, :length]] + [emb[:, 1 + j : 1 + j + length] for j in range(k + 1)]
            out.append(self.head_logits(k, torch.cat(parts, dim=-1)))
        return out


def build_hydra(target, shape: HeadsShape, vocab: DraftVocab | None = None) -> HydraHeads:
    """Fresh Hydra heads for ``target``: grounding blocks that pick the feature, projections copied from the target's
    LM head (its rows for ``vocab``'s ids over a draft vocabulary)."""
    lm_head = target.model.get_output_embeddings()
    weight = lm_head.weight
    if tuple(weight.shape) != (shape.vocab_size, shape.hidden_size):
        raise ValueError(f"heads of shape (V={shape.vocab_size}, H={shape.hidden_size}) do not fit the target's LM "
                         f"head {tuple(weight.shape)}")
    if getattr(lm_head, "bias", None) is not None and not shape.share_lm_head:
        raise ValueError("the target's LM head has a bias; use share_lm_head=True for this target")
    with built_like(weight.device, weight.dtype):  # on the target's device in its dtype, never a host copy first
        heads = HydraHeads(shape, target.model.get_input_embeddings(), lm_head, vocab)
    rows = weight.detach() if heads.vocab is None else heads.vocab.head_rows(lm_head)
    with torch.no_grad():
        for head in heads.heads:
            if head.proj is not None:
                head.proj.weight.copy_(rows.to(head.proj.weight.dtype))
    return heads.to(device=weight.device, dtype=weight.dtype)


def hydra_from_medusa(target, medusa: nn.Module) -> HydraHeads:
    """Hydra heads that propose exactly what the Medusa heads ``medusa`` (a MedusaHeads) propose: the grounding block
    is the Medusa head's first residual block reading the feature only (embedding columns zero), the other blocks and
    the projections copied; shape and draft vocabulary are the Medusa heads'. A warm start for training."""
    heads = build_hydra(target, medusa.shape, medusa.vocab)
    size = medusa.shape.hidden_size
    with torch.no_grad():
        for hydra_head, medusa_head in zip(heads.heads, medusa.heads, strict=True):
            first = medusa_head.blocks[0].linear
            hydra_head.blocks[0].linear.weight.zero_()
            hydra_head.blocks[0].linear.weight[:, :size].copy_(first.weight)
            hydra_head.blocks[0].linear.bias.copy_(first.bias)
            for ours, theirs in zip(list(hydra_head.blocks)[1:], list(medusa_head.blocks)[1:], strict=True):
                ours.load_state_dict(theirs.state_dict())
            if hydra_head.proj is not None:
                hydra_head.proj.load_state_dict(medusa_head.proj.state_dict())
    return heads


def hydra_loss(heads: HydraHeads, features: torch.Tensor, ids: torch.Tensor,
               decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """sum_k decay**k * CE(head k at t given x_{t+1..t+1+k}, x_{t+2+k}); also each head's CE. features (B, T, H)."""
    total, per_head = features.new_zeros(()), []
    for k, logits in enumerate(heads(features, ids)):
        targets = heads.draft_index(ids[:, 2 + k :].reshape(-1).to(logits.device))
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets, ignore_index=-100,
                                           reduction="sum") / (targets != -100).sum().clamp_min(1)
        total = total + decay**k * loss
        per_head.append(float(loss.detach()))
    return total, per_head


@torch.no_grad()
def hydra_rank_table(heads: HydraHeads, features: torch.Tensor, ids: torch.Tensor, ranks: int, start: int = 0,
                     batch: int = 8) -> torch.Tensor:
    """(N, K): at every position t >= start where every head has a label, the rank of x_{t+2+k} in head k's top
    ``ranks`` given the right tokens before it (``ranks`` when missed). Teacher forcing is exact here: a tree node
    is only reached when the tokens above it were the right ones."""
    k_heads, t = heads.shape.num_heads, ids.shape[1]
    end = t - 1 - k_heads
    if end <= start:
        raise ValueError(f"windows of {t} tokens are too short for {k_heads} heads from position {start}")
    device = next(heads.parameters()).device
    rows = []
    for first in range(0, ids.shape[0], batch):
        x, y = features[first : first + batch].to(device), ids[first : first + batch].to(device)
        per_head = []
        for k, logits in enumerate(heads(x, y)):
            top = heads.token_ids(logits[:, start:end].topk(ranks, dim=-1).indices)  # (b, L, ranks)
            hit = top == y[:, start + 2 + k : end + 2 + k, None]
            per_head.append(torch.where(hit.any(dim=-1), hit.int().argmax(dim=-1), ranks))
        rows.append(torch.stack(per_head, dim=-1).reshape(-1, k_heads).cpu())
    return torch.cat(rows)


def rank_accuracies(table: torch.Tensor, ranks: int) -> torch.Tensor:
    """(K, ranks): share of positions where head k's rank-r candidate was right, from a rank table (N, K)."""
    return torch.stack([torch.bincount(col, minlength=ranks + 1)[:ranks] for col in table.T]).double() / table.shape[0]
