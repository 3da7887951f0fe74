"""The EAGLE drafters: a dynamic token tree (EAGLE-2) or a chain from one draft layer over the target's features.

One class hierarchy, as vLLM's single ``EagleProposer``: :class:`EagleFamilyDrafter` holds what both variants do
(defaults, the lean forward, the layer call, the head, q over the whole vocabulary, the feature checks); a variant
supplies its model and how the target's features become the layer's input (``_fuse``, vLLM's
``combine_hidden_states``): EAGLE-1/2 reads the last feature as it is, EAGLE-3 fuses low/middle/high layers.

The drafter's KV cache holds one entry per committed pair (target feature at t, token t + 1): positions
``0 .. real - 1``. ``observe`` rolls back the entries of the last draft (their inputs were the layer's own
outputs) and queues the target's features; ``propose`` feeds the queued pairs in one call, whose last output is
the root's, then drafts from there with one batched call per depth. The queue, catch-up, chain and tree are
``specfamily.drafters.shared.feature_drafting``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.eagle.checkpoint import load_eagle3_weights, load_eagle_weights
from specfamily.drafters.eagle.config import Eagle3Config, EagleConfig
from specfamily.drafters.eagle.lean import (
    LeanEagle3Layer,
    LeanEagleLayer,
    lean_eagle3_unsupported,
    lean_eagle_unsupported,
)
from specfamily.drafters.eagle.model import DraftNetwork, EagleModel
from specfamily.drafters.eagle.model3 import Eagle3Model
from specfamily.drafters.eagle.tree_shape import TREE_SHAPES, default_tree_shape
from specfamily.drafters.shared.batched_features import propose_feature_batch
from specfamily.drafters.shared.feature_drafting import FeatureDrafter
from specfamily.drafters.shared.quantize import Int8Linears, causal_lm_linears
from specfamily.runtime.matmul import linear_for

DEFAULT_GAMMA = {"tree": 5, "chain": 4}  # the tree's: the device's tree shape (tree_shape.py) replaces it
# Tree size when the checkpoint carries no calibration (``python -m specfamily.drafters.eagle.calibrate`` measures
# the fastest shape on the machine and stores it): from the device's verify-cost curve, drafters/eagle/tree_shape.py.
# How trees choose children at temperature > 0 when not told (greedy is always top-k): the mode with more tau per
# unit of pass cost at t0.7 / top-p 0.9 on SmolLM2, for both variants (docs/sampled-trees.md).
DEFAULT_TREE_SAMPLING = "topk"


class EagleFamilyDrafter(FeatureDrafter):
    """Trees (top-k, q = None; or, sampling, children drawn without replacement with their conditional q) or chains
    (sampled with honest q); every q over the whole vocabulary, zero outside the draft vocabulary.

    ``calibration``: the drafting shape a checkpoint was calibrated for (mode, gamma, total_tokens), or {}.
    """

    model: DraftNetwork

    def __init__(self, target: Target, model: DraftNetwork, calibration: dict, gamma: int | None,
                 policy: str | None, mode: str | None, top_k: int | None, total_tokens: int | None,
                 tree_sampling: str | None = None, quantize: int = 0, quantize_head: bool = True) -> None:
        self.model = model
        self.quantize = quantize
        # the layer and the head's single rows, multiplied as the target does (or by their int8 copies)
        self.linear = int8_linears(model, quantize_head) if quantize else linear_for(target.matmul)
        self.forward = fast_forward(model, self.linear)
        mode = mode or calibration.get("mode", "tree")  # the calibrated shape's mode is the default
        calibrated = calibration.get("mode", "tree") == mode  # ... and its gamma that mode's default
        shape = default_tree_shape(target) if mode == "tree" else TREE_SHAPES[0]
        uncalibrated = shape.depth if mode == "tree" else DEFAULT_GAMMA[mode]
        self.default_gamma = calibration.get("gamma", uncalibrated) if calibrated else uncalibrated
        self.auto_max_gamma = None if mode == "tree" else BaseDrafter.auto_max_gamma  # trees: calibrated depth
        super().__init__(gamma, policy)
        self.mode = mode
        self.top_k = shape.top_k if top_k is None else top_k
        calibrated_tree = calibrated and mode == "tree"
        self.total_tokens = total_tokens or (calibration.get("total_tokens") if calibrated_tree else None) \
            or shape.total_tokens
        self.tree_sampling = tree_sampling or DEFAULT_TREE_SAMPLING
        if target.matmul == "stream":
            self._pack_products(target)

    def _pack_products(self, target: Target) -> None:
        """One dry call of the draft layer and the head, so the stream kernel packs every weight they multiply now,
        with the weights' loading, not on the first proposal of the drafter's first run (the kernel packs a weight on
        its first product and keeps the copy on it: a fresh drafter's draft-vocabulary head rows and layer would be
        packed inside a timed run, docs/batching-log.md, session 29). Nothing of it is kept but the packed copies."""
        with torch.no_grad():
            features = torch.zeros(1, self._feature_width(), dtype=target.dtype, device=target.device)
            token = torch.zeros(1, 1, dtype=torch.long, device=target.device)
            out = self._step(token, self._fuse(features)[None], torch.zeros_like(token), None, DynamicCache())
            self._draft_logits(out[0].repeat(2, 1))  # a tree depth's rows: the head's product over several rows

    def _feature_width(self) -> int:
        """Width of the target's features this variant reads: the last layer's, the layer's own width (``fc`` maps
        them and the token's embedding to it)."""
        return self.model.fc.out_features

    def observe(self, outcome: VerifyOutcome) -> None:
        """Roll back the last draft's entries and queue the target's features of the committed positions."""
        self._check_features(outcome.features)
        super().observe(outcome)

    def _check_features(self, features: torch.Tensor | None) -> None:
        """Refuse an outcome without the features this variant reads."""
        raise NotImplementedError

    @torch.inference_mode()
    def propose_batch(self, drafters: list, ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """Batched decoding: one draft-layer call per draft step for every slot (``shared/batched_features.py``);
        slots of another drafter or model fall back to their own ``propose``."""
        if not all(type(d) is type(self) and d.model is self.model and d.mode == self.mode for d in drafters):
            return super().propose_batch(drafters, ctxs, gammas)
        return propose_feature_batch(drafters, ctxs, gammas, self.batch_rows)

    def _step(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None, cache: DynamicCache) -> torch.Tensor:
        """(1, q, H) the layer's outputs for the pairs (input at t, token t + 1): what the next step reads and the
        head predicts from; through the lean layer when it reproduces the module path."""
        return self.forward(tokens, inputs, positions, mask, cache)

    def _draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden, self.linear)  # single rows multiplied as the target does

    def _full_q(self, q: torch.Tensor) -> torch.Tensor:
        return self.model.full_q(q)


class EagleDrafter(EagleFamilyDrafter):
    """EAGLE-1/2: one decoder layer of the target's family over (last target feature, next-token embedding),
    predicting the next feature, read by the target's LM head (or its draft-vocabulary rows)."""

    needs_features = True

    def __init__(
        self,
        target: Target,
        weights: str | Path | EagleModel | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        mode: str | None = None,
        top_k: int | None = None,
        total_tokens: int | None = None,
        seed: int = 0,
        draft_vocab: int | str | list[int] | None = None,
        tree_sampling: str | None = None,
        quantize: int = 0,
        quantize_head: bool = True,
    ) -> None:
        config = EagleConfig(weights, gamma, policy, mode, top_k, total_tokens, seed, draft_vocab, tree_sampling,
                             quantize, quantize_head)
        model, calibration = load_eagle_weights(target, config)
        super().__init__(target, model, calibration, gamma, policy, mode, top_k, total_tokens, tree_sampling,
                         quantize, quantize_head)

    def _check_features(self, features: torch.Tensor | None) -> None:
        if features is None:
            raise RuntimeError("eagle needs the target's features: the loop passes them when needs_features is True")


class Eagle3Drafter(EagleFamilyDrafter):
    """EAGLE-3: ``fc`` fuses the target's low/middle/high layer features; one widened Llama layer; its own head over
    a draft vocabulary (d2t/t2d)."""

    def __init__(
        self,
        target: Target,
        weights=None,
        gamma: int | None = None,
        policy: str | None = None,
        mode: str | None = None,
        top_k: int | None = None,
        total_tokens: int | None = None,
        layers: list[int] | tuple[int, ...] | None = None,
        draft_vocab: list[int] | None = None,
        seed: int = 0,
        tree_sampling: str | None = None,
        quantize: int = 0,
    ) -> None:
        config = Eagle3Config(weights, gamma, policy, mode, top_k, total_tokens, layers, draft_vocab, seed,
                              tree_sampling, quantize)
        model = load_eagle3_weights(target, config)
        self.needs_features: tuple[int, ...] = target.check_feature_layers(model.shape.layers)
        super().__init__(target, model, {}, gamma, policy, mode, top_k, total_tokens, tree_sampling, quantize)

    def _check_features(self, features: torch.Tensor | None) -> None:
        if features is None:
            raise RuntimeError("eagle3 needs the target's layer features: the loop passes them when needs_features "
                               "names layers")
        width = self.model.fc.in_features
        if features.shape[-1] != width:
            raise RuntimeError(f"eagle3 fuses {width}-wide features (layers {list(self.needs_features)}); "
                               f"got {features.shape[-1]}")

    def _feature_width(self) -> int:
        return self.model.fc.in_features  # the fused layers' features, side by side

    def _fuse(self, features: torch.Tensor) -> torch.Tensor:
        if self.quantize:
            return self.linear(features, self.model.fc.weight)  # fc's int8 copy
        return self.model.fuse(features)  # (m, H) of (m, k * H): vLLM's combine_hidden_states


def int8_linears(model: DraftNetwork, head: bool = True) -> Int8Linears:
    """``quantize=8``: int8 copies of the network's linear weights (fc, the layer's projections, EAGLE-3's own head)
    and, for EAGLE-1/2 with ``head``, of the head rows it reads from the target (a copy: the target keeps its float
    head; without ``head`` those rows stay float); the lean layer multiplies by them, so the network must be one it
    runs."""
    unsupported = lean_eagle3_unsupported if isinstance(model, Eagle3Model) else lean_eagle_unsupported
    reason = unsupported(model)
    if reason is not None:
        raise ValueError(f"quantize=8 runs the draft through its lean layer, which cannot run this model: {reason}")
    weights = causal_lm_linears(model)
    if isinstance(model, EagleModel) and head:
        lm_head = model.parts.lm_head
        if model.head_weight is not None:
            weights.append((model.head_weight, None))
        elif type(lm_head) is nn.Linear:
            weights.append((lm_head.weight, lm_head.bias))
    return Int8Linears(weights)


def fast_forward(model: DraftNetwork, linear: Callable = F.linear) -> Callable:
    """``model``'s forward through its lean layer whenever that reproduces the module path (``linear``: the
    target's kind of product, ``specfamily.runtime.matmul``)."""
    if isinstance(model, Eagle3Model):
        unsupported, lean_type = lean_eagle3_unsupported, LeanEagle3Layer
    else:
        unsupported, lean_type = lean_eagle_unsupported, LeanEagleLayer
    if unsupported(model) is not None:
        return model
    lean = lean_type(model, linear)
    return lambda *args: lean(*args) if lean.ready() else model(*args)
