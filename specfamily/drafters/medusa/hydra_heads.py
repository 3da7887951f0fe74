"""Hydra heads (Ankner et al. 2024, the base MLP variant): Medusa heads made sequentially dependent.

Head k reads the target's final-norm feature f at position t and the input embeddings of the k + 1 tokens after it,
x_{t+1} .. x_{t+1+k}, and predicts x_{t+2+k}. At decode time t is the position before the root (R - 1), x_{t+1} is
the root and x_{t+2} .. are the tokens drafted above the node being expanded: each head conditions on what was
drafted before it. Shapes, draft vocabulary and the shared LM head are Medusa's (:class:`HydraShape` adds r); the
embedding table is the target's (frozen, held outside the module tree like a shared LM head).

Slim conditioning: every prefix embedding e_j goes through one shared projection z_j = P e_j (H -> r, P starts as the
first r coordinates), and head k's grounding block is ``f + SiLU(W [f; z_1; ..; z_{k+1}] + b)`` (one matrix of
H x (H + (k + 1) r), W and b zero: an untrained Hydra head is an untrained Medusa head), then ``layers - 1`` residual
blocks, then the projection. Against the full layout (``R x + SiLU(W x + b)`` over (k + 2) H inputs: two matrices per
head) this keeps what each head sees and drops its size from sum_k 2 (k + 2) H^2 to sum_k (H + (k + 1) r) H + H r.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from specfamily.drafters.medusa.calibrate import rank_table
from specfamily.drafters.medusa.heads import HeadSet, HeadsShape, ResBlock, build_heads
from specfamily.drafters.shared.draft_vocab import DraftVocab

PREFIX_RANK = 256  # r, the default width of a prefix token's projection


@dataclass(frozen=True)
class HydraShape(HeadsShape):
    """Medusa's shape and the width r of the shared projection of the prefix tokens' embeddings."""

    prefix_rank: int = PREFIX_RANK

    def __post_init__(self) -> None:
        super().__post_init__()
        value = self.prefix_rank
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"prefix_rank must be an integer >= 1, got {value!r}")


class GroundBlock(nn.Module):
    """``f + SiLU(W [f; z] + b)``: the feature (..., H) and k + 1 projected prefix tokens z (..., (k + 1) r) to H;
    W and b start at zero (the identity on f)."""

    def __init__(self, hidden_size: int, prefix_width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size + prefix_width, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return f + nn.functional.silu(self.linear(torch.cat([f, z], dim=-1)))


class HydraHead(nn.Module):
    """Head k: the grounding block over f and k + 1 prefix tokens, ``layers - 1`` residual blocks, its projection
    (None when the LM head is shared)."""

    def __init__(self, shape: HydraShape, k: int) -> None:
        super().__init__()
        blocks = [GroundBlock(shape.hidden_size, (k + 1) * shape.prefix_rank)]
        self.blocks = nn.ModuleList(blocks + [ResBlock(shape.hidden_size) for _ in range(shape.layers - 1)])
        self.proj = None if shape.share_lm_head else nn.Linear(shape.hidden_size, shape.output_size, bias=False)

    def hidden(self, f: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](f, z)
        for block in list(self.blocks)[1:]:
            h = block(h)
        return h


class HydraHeads(HeadSet):
    """K sequentially dependent heads over a frozen target's feature and input embeddings.

    ``head_logits(k, x)``: logits (..., V or N) of head k for inputs x (..., (k + 2) H): f and the k + 1 prefix
    embeddings, concatenated. ``forward(features (B, T, H), ids (B, T))``: teacher-forced logits, a list over k of
    (B, T - 2 - k, V or N).
    """

    def __init__(self, shape: HydraShape, embed: nn.Module, lm_head: nn.Module | None = None,
                 vocab: DraftVocab | None = None) -> None:
        super().__init__(shape, [HydraHead(shape, k) for k in range(shape.num_heads)], lm_head, vocab)
        self.prefix = nn.Linear(shape.hidden_size, shape.prefix_rank, bias=False)  # P, shared by heads and positions
        with torch.no_grad():
            self.prefix.weight.copy_(torch.eye(shape.prefix_rank, shape.hidden_size))
        self._embed = (embed,)  # a tuple keeps the target's table out of parameters() and the state dict

    @classmethod
    def for_target(cls, target, shape: HydraShape, vocab: DraftVocab | None) -> HydraHeads:
        return cls(shape, target.model.get_input_embeddings(), target.model.get_output_embeddings(), vocab)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., H) the target's input embeddings of target token ids (no gradient: the table is frozen)."""
        with torch.no_grad():
            return self._embed[0](tokens)

    def head_logits(self, k: int, x: torch.Tensor, linear=None) -> torch.Tensor:
        """Logits of head k for concatenated inputs x (..., (k + 2) H); ``linear`` multiplies a shared head."""
        size = self.shape.hidden_size
        z = self.prefix(x[..., size:].unflatten(-1, (k + 1, size))).flatten(-2)  # (..., (k + 1) r)
        return self.project(self.heads[k].hidden(x[..., :size], z), self.heads[k], linear)

    def forward(self, features: torch.Tensor, ids: torch.Tensor, num_heads: int | None = None) -> list[torch.Tensor]:
        """Teacher-forced logits: entry k is (B, T - 2 - k, V or N), head k at t given x_{t+1} .. x_{t+1+k}."""
        t = ids.shape[1]
        z = self.prefix(self.embed(ids).to(features.dtype))  # (B, T, r), each token projected once
        out = []
        for k in range(self.shape.num_heads if num_heads is None else num_heads):
            length = t - 2 - k
            prefix = torch.cat([z[:, 1 + j : 1 + j + length] for j in range(k + 1)], dim=-1)
            out.append(self.project(self.heads[k].hidden(features[:, :length], prefix), self.heads[k]))
        return out


def build_hydra(target, shape: HeadsShape, vocab: DraftVocab | None = None) -> HydraHeads:
    """Fresh Hydra heads for ``target`` (a Medusa shape gets the default r): grounding blocks that pass the feature
    through, projections copied from the target's LM head (its rows for ``vocab``'s ids over a draft vocabulary)."""
    if not isinstance(shape, HydraShape):
        shape = HydraShape(**asdict(shape))
    return build_heads(target, shape, vocab, HydraHeads)


def hydra_shape_for(target, num_heads: int = 4, layers: int = 1, share_lm_head: bool = False, draft_vocab: int = 0,
                    prefix_rank: int = PREFIX_RANK) -> HydraShape:
    """The Hydra heads shape that fits ``target``."""
    return HydraShape(num_heads, target.hidden_size, target.vocab_size, layers, share_lm_head, draft_vocab,
                      prefix_rank)


def hydra_from_medusa(target, medusa: nn.Module) -> HydraHeads:
    """Hydra heads that propose exactly what the Medusa heads ``medusa`` (a MedusaHeads) propose: the grounding block
    is the Medusa head's first residual block reading the feature only (prefix columns zero), the other blocks and
    the projections copied; shape and draft vocabulary are the Medusa heads' (r the default). A warm start for
    training."""
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


def hydra_logits(heads: HydraHeads, features: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    """Teacher-forced logits of every head (``heads(features, ids)``), the distillation objective's input."""
    return heads(features, ids)


def hydra_rank_table(heads: HydraHeads, features: torch.Tensor, ids: torch.Tensor, ranks: int, start: int = 0,
                     batch: int = 8) -> torch.Tensor:
    """(N, K): at every position t >= start where every head has a label, the rank of x_{t+2+k} in head k's top
    ``ranks`` given the right tokens before it (``ranks`` when missed): Medusa's ``rank_table`` on the teacher-forced
    logits. Teacher forcing is exact here: a tree node is only reached when the tokens above it were the right ones."""
    return rank_table(heads, features, ids, ranks, start, batch, _teacher_forced)


def _teacher_forced(heads: HydraHeads, x: torch.Tensor, y: torch.Tensor, start: int, end: int) -> list[torch.Tensor]:
    return [logits[:, start:end] for logits in heads(x, y)]


def rank_accuracies(table: torch.Tensor, ranks: int) -> torch.Tensor:
    """(K, ranks): share of positions where head k's rank-r candidate was right, from a rank table (N, K)."""
    return torch.stack([torch.bincount(col, minlength=ranks + 1)[:ranks] for col in table.T]).double() / table.shape[0]
