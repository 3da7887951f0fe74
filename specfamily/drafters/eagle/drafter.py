"""EAGLE drafter: a dynamic token tree (EAGLE-2) or a chain (EAGLE-1 style) from one decoder layer over features.

The drafter's KV cache holds one entry per committed pair (target feature at t, token t + 1): positions
``0 .. real - 1``. ``observe`` rolls back the entries of the last draft (their features were predictions) and
queues the target's real features; ``propose`` feeds the queued pairs in one call, whose last output predicts the
root's feature, then drafts from there with one batched call per depth. The queue, catch-up, chain and tree are
``specfamily.drafters.shared.feature_drafting``'s; this module holds EAGLE's model, lean layer and calibrated defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import DynamicCache

from specfamily import zoo
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.eagle.checkpoint import load_eagle
from specfamily.drafters.eagle.config import EagleConfig
from specfamily.drafters.eagle.lean import LeanEagleLayer, lean_eagle_unsupported
from specfamily.drafters.eagle.model import EagleModel, build_model
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.drafters.shared.feature_drafting import FeatureDrafter
from specfamily.runtime.matmul import linear_for

DEFAULT_GAMMA = {"tree": 5, "chain": 4}
DEFAULT_TOP_K = 4
# Nodes kept per tree when the checkpoint carries no calibration (``python -m specfamily.drafters.eagle.calibrate``
# measures the fastest shape on the machine and stores it). On CPU a verify pass over n tokens grows quickly with
# n, so the best tree is far below EAGLE-2's GPU default of 60.
DEFAULT_TOTAL_TOKENS = 12


class EagleDrafter(FeatureDrafter):
    """EAGLE-1/2 over the target's features; deterministic trees (q = None) or sampled chains with honest q."""

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
    ) -> None:
        config = EagleConfig(weights, gamma, policy, mode, top_k, total_tokens, seed, draft_vocab)
        self.model, calibration = _load(target, config)
        self.linear = linear_for(target.matmul)  # the layer and the head's single rows, multiplied as the target does
        self.forward = fast_forward(self.model, self.linear)
        mode = mode or calibration.get("mode", "tree")  # the calibrated shape's mode is the default
        calibrated = calibration.get("mode", "tree") == mode  # ... and its gamma that mode's default
        self.default_gamma = calibration.get("gamma", DEFAULT_GAMMA[mode]) if calibrated else DEFAULT_GAMMA[mode]
        self.auto_max_gamma = None if mode == "tree" else BaseDrafter.auto_max_gamma  # trees: calibrated depth
        super().__init__(gamma, policy)
        self.mode = mode
        self.top_k = DEFAULT_TOP_K if top_k is None else top_k
        calibrated_tree = calibrated and mode == "tree"
        self.total_tokens = total_tokens or (calibration.get("total_tokens") if calibrated_tree else None) \
            or DEFAULT_TOTAL_TOKENS

    def observe(self, outcome: VerifyOutcome) -> None:
        """Roll back the last draft's entries and queue the target's features of the committed positions."""
        if outcome.features is None:
            raise RuntimeError("eagle needs the target's features: the loop passes them when needs_features is True")
        super().observe(outcome)

    def _step(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None, cache: DynamicCache) -> torch.Tensor:
        """(1, q, H) predicted features at t + 1 of the pairs (feature at t, token t + 1), through the lean layer."""
        return self.forward(tokens, inputs, positions, mask, cache)

    def _draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden, self.linear)  # single rows multiplied as the target does

    def _full_q(self, q: torch.Tensor) -> torch.Tensor:
        return q if self.model.vocab is None else self.model.vocab.full_q(q)


def fast_forward(model: EagleModel, linear: Callable = torch.nn.functional.linear) -> Callable:
    """``model``'s forward through the lean layer whenever that reproduces the module path, multiplying with
    ``linear`` (``specfamily.runtime.matmul``: the target's kind)."""
    if lean_eagle_unsupported(model) is not None:
        return model
    lean = LeanEagleLayer(model, linear)
    return lambda *args: lean(*args) if lean.ready() else model(*args)


def _load(target: Target, config: EagleConfig) -> tuple[EagleModel, dict]:
    """The model and its calibration: fresh modules for weights="random", a built model as is, else the
    checkpoint (default: the zoo's eagle weights for this target) with the tree shape calibrated for it, if any."""
    if isinstance(config.weights, EagleModel):
        if config.weights.parts.lm_head is not target.model.get_output_embeddings():
            raise ValueError("this EagleModel was built for another target (it reads another model's LM head)")
        return config.weights, {}
    if config.weights == "random":
        ids = config.draft_vocab if isinstance(config.draft_vocab, list) else None
        vocab = None if ids is None else DraftVocab(torch.tensor(sorted(ids), dtype=torch.long), target.vocab_size)
        return build_model(target.model, seed=config.seed, vocab=vocab), {}
    weights = zoo.default_weights("eagle", target) if config.weights is None else config.weights
    model, saved = load_eagle(weights, target.model)
    if config.draft_vocab == "full":
        model.use_vocab(None)
    elif isinstance(config.draft_vocab, int):
        if model.vocab is None:
            raise ValueError("these eagle weights draft over the full vocabulary; draft_vocab=<size> restricts a "
                             "reduced one (train with --draft-vocab N)")
        model.use_vocab(model.vocab.restrict(config.draft_vocab))
    return model, saved.get("calibration") or {}
