"""Options of the EAGLE drafter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("tree", "chain")


@dataclass
class EagleConfig:
    weights: Any = None  # a folder, a zoo: name, "random" or an EagleModel for the target; None: the zoo's
    gamma: int | None = None  # tree depth (tree mode) or draft length (chain mode); default per mode
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    mode: str | None = None  # tree: EAGLE-2 dynamic tree; chain: EAGLE-1 style; None: the calibrated one, else tree
    top_k: int | None = None  # tree mode: children per expanded node and nodes expanded per depth
    total_tokens: int | None = None  # tree mode: nodes kept after reranking
    seed: int = 0  # initialisation of weights="random"
    # None: as trained; "full": the target's whole LM head; an int n: the n most frequent ids of the trained draft
    # vocabulary; a list of target ids: weights="random" only
    draft_vocab: Any = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"eagle mode must be one of {MODES}, got {self.mode!r}")
        for name in ("gamma", "top_k", "total_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"eagle {name} must be an integer >= 1, got {value!r}")
        vocab = self.draft_vocab
        if isinstance(vocab, Sequence) and not isinstance(vocab, str):
            vocab = self.draft_vocab = [int(token) for token in vocab]  # a list or tuple, or a Hydra ListConfig
        if isinstance(vocab, list) and self.weights != "random":
            raise ValueError("an eagle draft_vocab list of ids applies to weights='random'; trained weights take "
                             "'full' or a size")
        if not (vocab is None or vocab == "full" or isinstance(vocab, list)
                or (isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 1)):
            raise ValueError(f"eagle draft_vocab must be 'full', a size >= 1 or a list of ids, got {vocab!r}")
        if self.weights is not None and not isinstance(self.weights, (str, Path)):
            from specfamily.drafters.eagle.model import EagleModel

            if not isinstance(self.weights, EagleModel):
                raise TypeError(
                    "eagle weights must be a folder, a zoo: name, 'random' or an EagleModel, "
                    f"got {type(self.weights).__name__}"
                )
