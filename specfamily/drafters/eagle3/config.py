"""Options of the EAGLE-3 drafter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("tree", "chain")


@dataclass
class Eagle3Config:
    weights: Any = None  # a folder (ours, EAGLE/SpecForge or speculators layout), "random", or an Eagle3Model
    gamma: int | None = None  # tree depth (tree mode) or draft length (chain mode); default per mode
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    mode: str | None = None  # tree: EAGLE-2 dynamic tree; chain: one sampled (or argmax) path; None: tree
    top_k: int | None = None  # tree mode: children per expanded node and nodes expanded per depth
    total_tokens: int | None = None  # tree mode: nodes kept after reranking
    layers: Any = None  # target feature layer ids; None: the checkpoint's, else the reference's (2, L // 2, L - 3)
    draft_vocab: Any = None  # weights="random": None (the whole vocabulary) or a list of target ids
    seed: int = 0  # initialisation of weights="random"

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"eagle3 mode must be one of {MODES}, got {self.mode!r}")
        for name in ("gamma", "top_k", "total_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"eagle3 {name} must be an integer >= 1, got {value!r}")
        self.layers = _int_tuple("layers", self.layers)
        vocab = _int_tuple("draft_vocab", self.draft_vocab)
        self.draft_vocab = None if vocab is None else list(vocab)
        if self.draft_vocab is not None and self.weights != "random":
            raise ValueError("an eagle3 draft_vocab list of ids applies to weights='random'; trained weights carry "
                             "their own (d2t)")
        if self.weights is not None and not isinstance(self.weights, (str, Path)):
            from specfamily.drafters.eagle3.model import Eagle3Model

            if not isinstance(self.weights, Eagle3Model):
                raise TypeError("eagle3 weights must be a folder, 'random' or an Eagle3Model, "
                                f"got {type(self.weights).__name__}")


def _int_tuple(name: str, value: Any) -> tuple[int, ...] | None:
    """None, or a non-empty sequence of ints (a list, a tuple or a Hydra ListConfig) as a tuple."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not len(value):
        raise ValueError(f"eagle3 {name} must be a non-empty list of integers, got {value!r}")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise ValueError(f"eagle3 {name} must be a list of integers, got {list(value)!r}")
    return tuple(int(i) for i in value)
