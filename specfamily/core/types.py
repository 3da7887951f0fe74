"""Dataclasses shared by the engine and the drafters: sampling settings, drafts, outcomes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from specfamily.core.side_rows import SideRows

if TYPE_CHECKING:
    from specfamily.core.metrics import Metrics
    from specfamily.core.trace import Trace


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        temperature = self.temperature
        if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Draft:
    """A token tree over the current context; a chain has parents [-1, 0, 1, ...].

    ``q`` row i is the distribution token i was actually sampled from (after the target's warping),
    or ``q is None`` for deterministic proposals, which the verifier treats as one-hot. ``side``: rows fed in the same
    pass that the verifier never sees and the cache never keeps, whose logits come back to the drafter
    (``specfamily.core.side_rows``); None for none. ``evidence``: what a copy drafter matched to propose it (its
    n-gram's or suffix's length), which the batched plan values its acceptance by (``core/batch_evidence.py``); 0 for
    a drafter that does not say.
    """

    tokens: torch.Tensor  # (n,) long
    parents: torch.Tensor  # (n,) long, -1 for children of the root, parents[i] < i
    q: torch.Tensor | None = None  # (n, V)
    catch_up_seconds: float = 0.0  # of the proposal's time, spent feeding context the drafter had not seen yet
    side: SideRows | None = None  # rows for the drafter's own reading (never verified, never committed)
    evidence: int = 0  # a copy drafter's match length behind the proposal (prompt lookup's n, suffix's); 0: unknown

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        self.parents = torch.as_tensor(self.parents, dtype=torch.long).reshape(-1)
        n = self.tokens.numel()
        if self.parents.numel() != n:
            raise ValueError(f"draft has {n} tokens but {self.parents.numel()} parents")
        if n and bool(((self.parents < -1) | (self.parents >= torch.arange(n))).any()):
            raise ValueError("draft parents must satisfy -1 <= parents[i] < i")
        if self.q is not None and (self.q.dim() != 2 or self.q.shape[0] != n):
            raise ValueError(f"draft q must have shape (n={n}, V), got {tuple(self.q.shape)}")
        if self.side is not None and not isinstance(self.side, SideRows):
            raise TypeError(f"draft side rows must be a SideRows or None, got {type(self.side).__name__}")

    @classmethod
    def chain(cls, tokens, q: torch.Tensor | None = None, side: SideRows | None = None) -> Draft:
        tokens = torch.as_tensor(tokens, dtype=torch.long).reshape(-1)
        return cls(tokens, torch.arange(tokens.numel()) - 1, q, side=side)

    @classmethod
    def empty(cls) -> Draft:
        return cls(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def is_chain(self) -> bool:
        return bool((self.parents == torch.arange(len(self)) - 1).all())

    def verified_depth(self, path: list[int]) -> int:
        """Levels the verifier tried for an accepted ``path`` (node indices from the root down): the path, plus one
        when its last node (or the root, for an empty path) has children."""
        node = path[-1] if path else -1
        return len(path) + int(bool((self.parents == node).any()))

    def depths(self) -> torch.Tensor:
        """(n,) depth of each node; children of the root have depth 1."""
        depth = [0] * len(self)
        for i, parent in enumerate(self.parents.tolist()):
            depth[i] = 1 if parent < 0 else depth[parent] + 1
        return torch.tensor(depth, dtype=torch.long)


@dataclass
class VerifyOutcome:
    """What one verification committed, handed to ``Drafter.observe``.

    ``tokens`` are the new committed tokens: the accepted draft tokens, then the target's token.
    ``features`` (only for drafters with ``needs_features``): (m, H) features of the positions
    processed in this pass that lie on the committed path, in order; row j is the feature at
    absolute position ``feature_start + j``, i.e. the one that produced the token at position
    ``feature_start + j + 1``. Usually the root and the accepted nodes; on the first pass the
    whole prompt. A drafter whose ``needs_features`` names k layers gets (m, k * H), those layers concatenated.
    ``logits``: (draft_size + 1, V) the target's logits of this pass as it returned them (before processors and
    warping): row 0 at the root, row i + 1 after draft node i, every drafted node, accepted or not. For drafters
    that learn from what the target already computed (Token Recycling); a view that is only valid during ``observe``.
    ``side_logits``: (s, V) the target's logits at the draft's side rows, in their order (None without side rows).
    ``drafted``: (draft_size,) the tokens of the draft as it was fed, in node order. The batched loop may feed a
    deterministic proposal cut to its first levels (``core.batch_lengths.truncated``), so a drafter that keeps
    what it proposed learns here which of it the pass fed (None: not told, the caller built the outcome itself).
    """

    tokens: list[int]
    accepted_nodes: list[int]
    draft_size: int
    features: torch.Tensor | None = None  # (m, H) or (m, k * H)
    feature_start: int = 0
    logits: torch.Tensor | None = None  # (draft_size + 1, V)
    side_logits: torch.Tensor | None = None  # (s, V)
    drafted: torch.Tensor | None = None  # (draft_size,)


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only; an EOS that ends the text is included
    metrics: Metrics
    lossy: bool = False
    trace: Trace | None = None  # every pass (specfamily.core.trace); None when generate(trace=False)
