"""Options of the two EAGLE drafters: ``eagle`` (EAGLE-1/2) and ``eagle3`` (EAGLE-3).

Both share the drafting shape (mode, gamma, policy, top_k, total_tokens, tree_sampling) and its checks; each adds
what its weights need. Field order is the drafters' positional order (``tree_sampling``, added later, comes last).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specfamily.drafters.shared.quantize import check_bits

MODES = ("tree", "chain")
TREE_SAMPLING = ("topk", "sampled")  # as specfamily.drafters.shared.feature_drafting.TREE_SAMPLING


@dataclass
class DraftShapeConfig:
    """The options both variants take; ``NAME`` is the registered name their messages use."""

    weights: Any = None  # a folder, a zoo: name, "random" or a built model for the target; None: the zoo's
    gamma: int | None = None  # tree depth (tree mode) or draft length (chain mode); default per mode
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    mode: str | None = None  # tree: EAGLE-2 dynamic tree; chain: one sampled (or argmax) path; None: see variant
    top_k: int | None = None  # tree mode: children per expanded node and nodes expanded per depth
    total_tokens: int | None = None  # tree mode: nodes kept after reranking

    NAME = "eagle"

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"{self.NAME} mode must be one of {MODES}, got {self.mode!r}")
        for name in ("gamma", "top_k", "total_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{self.NAME} {name} must be an integer >= 1, got {value!r}")
        check_bits(getattr(self, "quantize", 0))
        tree_sampling = getattr(self, "tree_sampling", None)
        if tree_sampling is not None and tree_sampling not in TREE_SAMPLING:
            raise ValueError(f"{self.NAME} tree_sampling must be one of {TREE_SAMPLING}, got {tree_sampling!r}")

    def _check_weights(self, accepted: str) -> None:
        """A built model given as weights must be the variant's; ``accepted`` lists what may be given."""
        if self.weights is not None and not isinstance(self.weights, (str, Path)) \
                and not isinstance(self.weights, self._model_type()):
            raise TypeError(f"{self.NAME} weights must be {accepted}, got {type(self.weights).__name__}")

    def _model_type(self) -> type:
        raise NotImplementedError


@dataclass
class EagleConfig(DraftShapeConfig):
    """EAGLE-1/2; mode None: the checkpoint's calibrated one, else tree."""

    seed: int = 0  # initialisation of weights="random"
    # None: as trained; "full": the target's whole LM head; an int n: the n most frequent ids of the trained draft
    # vocabulary; a list of target ids: weights="random" only
    draft_vocab: Any = None
    # tree mode at temperature > 0: "topk" (deterministic children, q = None) or "sampled" (drawn without
    # replacement from the warped q, conditional q reported); None: the measured default; greedy is always top-k
    tree_sampling: str | None = None
    quantize: int = 0  # 8: the draft's own linears and the head it reads with int8 weights (shared/quantize.py)
    quantize_head: bool = True  # with quantize=8: False keeps the head rows it reads from the target in float

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.quantize_head, bool):
            raise ValueError(f"eagle quantize_head must be true or false, got {self.quantize_head!r}")
        if not self.quantize_head and not self.quantize:
            raise ValueError("eagle quantize_head=false applies to quantize=8 (the float draft's head is float)")
        vocab = self.draft_vocab
        if isinstance(vocab, Sequence) and not isinstance(vocab, str):
            vocab = self.draft_vocab = [int(token) for token in vocab]  # a list or tuple, or a Hydra ListConfig
        if isinstance(vocab, list) and self.weights != "random":
            raise ValueError("an eagle draft_vocab list of ids applies to weights='random'; trained weights take "
                             "'full' or a size")
        if not (vocab is None or vocab == "full" or isinstance(vocab, list)
                or (isinstance(vocab, int) and not isinstance(vocab, bool) and vocab >= 1)):
            raise ValueError(f"eagle draft_vocab must be 'full', a size >= 1 or a list of ids, got {vocab!r}")
        self._check_weights("a folder, a zoo: name, 'random' or an EagleModel")

    def _model_type(self) -> type:
        from specfamily.drafters.eagle.model import EagleModel

        return EagleModel


@dataclass
class Eagle3Config(DraftShapeConfig):
    """EAGLE-3 (weights: ours, EAGLE/SpecForge or speculators layout); mode None: tree."""

    layers: Any = None  # target feature layer ids; None: the checkpoint's, else the reference's (2, L // 2, L - 3)
    draft_vocab: Any = None  # weights="random": None (the whole vocabulary) or a list of target ids
    seed: int = 0  # initialisation of weights="random"
    tree_sampling: str | None = None  # as EagleConfig's
    quantize: int = 0  # 8: fc, the layer's projections and the own LM head with int8 weights (shared/quantize.py)

    NAME = "eagle3"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.layers = _int_tuple("layers", self.layers)
        vocab = _int_tuple("draft_vocab", self.draft_vocab)
        self.draft_vocab = None if vocab is None else list(vocab)
        if self.draft_vocab is not None and self.weights != "random":
            raise ValueError("an eagle3 draft_vocab list of ids applies to weights='random'; trained weights carry "
                             "their own (d2t)")
        self._check_weights("a folder, 'random' or an Eagle3Model")

    def _model_type(self) -> type:
        from specfamily.drafters.eagle.model3 import Eagle3Model

        return Eagle3Model


def _int_tuple(name: str, value: Any) -> tuple[int, ...] | None:
    """None, or a non-empty sequence of ints (a list, a tuple or a Hydra ListConfig) as a tuple."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not len(value):
        raise ValueError(f"eagle3 {name} must be a non-empty list of integers, got {value!r}")
    if any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        raise ValueError(f"eagle3 {name} must be a list of integers, got {list(value)!r}")
    return tuple(int(i) for i in value)
