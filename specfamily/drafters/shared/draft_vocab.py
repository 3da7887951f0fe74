"""Reduced draft vocabularies (FR-Spec; EAGLE-3's draft vocabulary with its d2t map).

A drafter's LM head may score only the N most frequent training tokens (the target head's rows for them), so a draft
step costs N / V of the full projection. The target still verifies over its whole vocabulary: a drafted token is a
target token (``ids[i]``, the d2t map) and a reported q is zero outside the subset, exactly the law it drew from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DraftVocab:
    """The target ids a drafter may propose, in ascending order (draft index i -> target id ``ids[i]``)."""

    ids: torch.Tensor  # (N,) long, strictly increasing, each < vocab_size
    vocab_size: int  # V, the target's vocabulary
    counts: torch.Tensor | None = None  # (N,) long: how often each id occurred in the data it was counted on

    def __post_init__(self) -> None:
        ids = self.ids
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype != torch.long:
            raise ValueError(f"a draft vocabulary is a non-empty 1-d long tensor of token ids, got {ids.dtype} "
                             f"{tuple(ids.shape)}")
        if ids.is_meta:  # laid out before any values exist (they were checked where they were made)
            return
        if bool((ids[1:] <= ids[:-1]).any()):
            raise ValueError("draft vocabulary ids must be strictly increasing (distinct, sorted)")
        if self.counts is not None and self.counts.shape != ids.shape:
            raise ValueError(f"{self.counts.numel()} counts for {ids.numel()} draft vocabulary ids")
        if int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in [0, {self.vocab_size}), got {int(ids[0])}.."
                             f"{int(ids[-1])}")

    @property
    def size(self) -> int:
        return self.ids.numel()

    def restrict(self, size: int) -> DraftVocab:
        """The ``size`` most counted ids of this vocabulary (ties: lower id first)."""
        if self.counts is None:
            raise ValueError("this draft vocabulary has no counts to restrict it by")
        if not 0 < size <= self.size:
            raise ValueError(f"a restriction of a draft vocabulary of {self.size} needs 1..{self.size} tokens, "
                             f"got {size}")
        keep = torch.sort(torch.sort(self.counts, descending=True, stable=True).indices[:size]).values
        return DraftVocab(self.ids[keep], self.vocab_size, self.counts[keep])

    def to(self, device: torch.device | str) -> DraftVocab:
        """This vocabulary with its ids (and counts) on ``device``: keep it where the drafter runs, so mapping
        draft indices copies nothing per step."""
        counts = None if self.counts is None else self.counts.to(device)
        return DraftVocab(self.ids.to(device), self.vocab_size, counts)

    def to_target(self, draft_index: torch.Tensor) -> torch.Tensor:
        """Target ids of draft indices (any shape)."""
        return self.ids.to(draft_index.device)[draft_index]

    def head_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The (N, H) rows of a (V, H) LM-head weight for the draft vocabulary (a copy)."""
        if weight.shape[0] != self.vocab_size:
            raise ValueError(f"an LM head of {weight.shape[0]} rows does not fit a draft vocabulary over "
                             f"{self.vocab_size} tokens")
        return weight.index_select(0, self.ids.to(weight.device)).contiguous()

    def head_rows(self, lm_head: torch.nn.Module) -> torch.Tensor:
        """:meth:`head_weight` of a target's LM head, which must be a plain linear map without bias."""
        if not isinstance(lm_head, torch.nn.Linear) or lm_head.bias is not None:
            raise ValueError("a reduced draft vocabulary needs a target whose LM head is a linear map without bias")
        return self.head_weight(lm_head.weight.detach())

    def full_q(self, q: torch.Tensor) -> torch.Tensor:
        """(..., V) distribution with ``q`` (..., N) on the draft ids and zero elsewhere."""
        out = q.new_zeros((*q.shape[:-1], self.vocab_size))
        return out.index_copy_(q.dim() - 1, self.ids.to(q.device), q)


def d2t_of(vocab: DraftVocab) -> torch.Tensor:
    """EAGLE-3's (N,) long offsets: target id = draft index + d2t[draft index]."""
    return vocab.ids - torch.arange(vocab.size, device=vocab.ids.device)


def t2d_of(vocab: DraftVocab) -> torch.Tensor:
    """EAGLE-3's (V,) bool mask of the target ids inside the draft vocabulary."""
    mask = torch.zeros(vocab.vocab_size, dtype=torch.bool, device=vocab.ids.device)
    mask[vocab.ids] = True
    return mask


def vocab_from_d2t(
    d2t: torch.Tensor, vocab_size: int, t2d: torch.Tensor | None = None
) -> tuple[DraftVocab, torch.Tensor]:
    """The draft vocabulary an EAGLE-3 ``d2t`` (N,) maps to, and the (N,) order that sorts its draft indices by
    target id (apply it to the LM head's rows). ``t2d`` (V,) bool, when given, must mark exactly those ids."""
    if d2t.dim() != 1 or d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise ValueError(f"d2t must be a 1-d integer tensor, got {d2t.dtype} {tuple(d2t.shape)}")
    ids = torch.arange(d2t.numel()) + d2t.long().cpu()
    order = torch.argsort(ids)
    sorted_ids = ids[order]
    if sorted_ids.numel() > 1 and bool((sorted_ids[1:] == sorted_ids[:-1]).any()):
        raise ValueError("d2t maps two draft indices to the same target id")
    vocab = DraftVocab(sorted_ids, vocab_size)  # refuses ids outside [0, vocab_size)
    if t2d is not None:
        if t2d.shape != (vocab_size,):
            raise ValueError(f"t2d has shape {tuple(t2d.shape)}; the target's vocabulary needs ({vocab_size},)")
        if not torch.equal(t2d.bool().cpu(), t2d_of(vocab)):
            raise ValueError("t2d does not mark the target ids d2t maps to")
    return vocab, order


def frequent_tokens(tokens: np.ndarray | torch.Tensor, size: int, vocab_size: int,
                    always: tuple[int, ...] = ()) -> DraftVocab:
    """The ``size`` most frequent ids of ``tokens`` (ties: lower id first), plus ``always`` (e.g. EOS)."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"a draft vocabulary needs 1..{vocab_size} tokens, got {size}")
    counts = torch.bincount(torch.as_tensor(np.asarray(tokens).reshape(-1), dtype=torch.long), minlength=vocab_size)
    if counts.numel() > vocab_size:
        raise ValueError(f"token id {counts.numel() - 1} is outside the vocabulary of {vocab_size}")
    order = torch.sort(counts, descending=True, stable=True).indices
    chosen = set(order[:size].tolist())
    for token in always:
        if token not in chosen:
            chosen.discard(min((t for t in chosen if t not in always), key=lambda t: (counts[t], -t)))
            chosen.add(token)
    ids = torch.tensor(sorted(chosen), dtype=torch.long)
    return DraftVocab(ids, vocab_size, counts[ids])


def target_draft_vocab(size: int, target, counted: np.ndarray | torch.Tensor) -> DraftVocab | None:
    """A trainer's ``--draft-vocab``: the ``size`` most frequent tokens of ``counted`` with the target's EOS always
    in; None for size 0 (the full vocabulary)."""
    if not size:
        return None
    if size > target.vocab_size:
        raise ValueError(f"draft_vocab {size} exceeds the target's vocabulary of {target.vocab_size}")
    always = (target.eos_token_id,) if target.eos_token_id is not None else ()
    return frequent_tokens(counted, size, target.vocab_size, always)


def coverage(tokens: np.ndarray | torch.Tensor, vocab: DraftVocab) -> float:
    """Share of ``tokens`` inside the draft vocabulary (an upper bound on the head's top-1 agreement)."""
    flat = torch.as_tensor(np.asarray(tokens).reshape(-1), dtype=torch.long)
    inside = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    inside[vocab.ids] = True
    return float(inside[flat].float().mean()) if flat.numel() else float("nan")
