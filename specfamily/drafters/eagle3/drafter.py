"""EAGLE-3 drafter: a dynamic token tree (EAGLE-2) or a chain from fused low/middle/high target features.

The drafter's KV cache holds one entry per committed pair (fused target feature at t, token t + 1): positions
``0 .. real - 1``. ``observe`` rolls back the entries of the last draft (their inputs were the layer's own
outputs) and queues the target's layer features; ``propose`` fuses and feeds the queued pairs in one call, whose
last output predicts the token after the root, then drafts from there, each step reading its parent's output.
The queue, catch-up, chain and tree are ``specfamily.drafters.shared.feature_drafting``'s; this module holds the
fusion, the layer call and loading.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specfamily import zoo
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.eagle3.config import Eagle3Config
from specfamily.drafters.eagle3.lean import LeanEagle3Layer, lean_eagle3_unsupported
from specfamily.drafters.eagle3.model import Eagle3Model, Eagle3Shape, build_model, default_layers, draft_layer_config
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.drafters.shared.feature_drafting import FeatureDrafter
from specfamily.runtime.matmul import linear_for

DEFAULT_GAMMA = {"tree": 5, "chain": 4}
DEFAULT_TOP_K = 4
DEFAULT_TOTAL_TOKENS = 12  # nodes per tree on CPU, where a verify pass over n tokens grows quickly with n


class Eagle3Drafter(FeatureDrafter):
    """EAGLE-3 over the target's layer features; deterministic trees (q = None) or sampled chains with honest q
    (over the draft vocabulary, zero outside it)."""

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
    ) -> None:
        config = Eagle3Config(weights, gamma, policy, mode, top_k, total_tokens, layers, draft_vocab, seed)
        self.model = load_model(target, config)
        self.needs_features: tuple[int, ...] = target.check_feature_layers(self.model.shape.layers)
        self.linear = linear_for(target.matmul)  # the layer and the head's single rows, multiplied as the target does
        self.forward = fast_forward(self.model, self.linear)
        self.mode = config.mode or "tree"
        self.default_gamma = DEFAULT_GAMMA[self.mode]
        self.auto_max_gamma = None if self.mode == "tree" else BaseDrafter.auto_max_gamma
        super().__init__(gamma, policy)
        self.top_k = config.top_k or DEFAULT_TOP_K
        self.total_tokens = config.total_tokens or DEFAULT_TOTAL_TOKENS

    def observe(self, outcome: VerifyOutcome) -> None:
        """Roll back the last draft's entries and queue the target's layer features of the committed positions."""
        if outcome.features is None:
            raise RuntimeError("eagle3 needs the target's layer features: the loop passes them when needs_features "
                               "names layers")
        width = self.model.fc.in_features
        if outcome.features.shape[-1] != width:
            raise RuntimeError(f"eagle3 fuses {width}-wide features (layers {list(self.needs_features)}); "
                               f"got {outcome.features.shape[-1]}")
        super().observe(outcome)

    def _fuse(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.fuse(features)  # (m, H) of (m, k * H)

    def _step(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None, cache: DynamicCache) -> torch.Tensor:
        """(1, q, H) the layer's outputs: what the next step reads and the head predicts from."""
        return self.forward(tokens, inputs, positions, mask, cache)

    def _draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden, self.linear)  # single rows multiplied as the target does

    def _full_q(self, q: torch.Tensor) -> torch.Tensor:
        return self.model.full_q(q)


def fast_forward(model: Eagle3Model, linear: Callable = F.linear) -> Callable:
    """``model``'s forward through the lean layer whenever that reproduces the module path (``linear``: the
    target's kind of product, ``specfamily.runtime.matmul``)."""
    if lean_eagle3_unsupported(model) is not None:
        return model
    lean = LeanEagle3Layer(model, linear)
    return lambda *args: lean(*args) if lean.ready() else model(*args)


def load_model(target: Target, config: Eagle3Config) -> Eagle3Model:
    """A built model as is, fresh modules for weights="random", else the checkpoint folder in any layout (default:
    the zoo's eagle3 weights for this target; a ``zoo:`` name is its shipped folder)."""
    weights = config.weights
    if isinstance(weights, Eagle3Model):
        if weights.target_embed[0] is not target.model.get_input_embeddings():
            raise ValueError("this Eagle3Model was built for another target (it reads another model's embedding)")
        return _checked_layers(weights, config.layers)
    if weights == "random":
        layers = config.layers or default_layers(target.num_layers)
        target.check_feature_layers(layers)
        vocab = _random_vocab(config.draft_vocab, target.vocab_size)
        shape = Eagle3Shape(draft_layer_config(target.model), layers)
        return build_model(target.model, shape, vocab, seed=config.seed)
    if weights is None:
        weights = zoo.default_weights("eagle3", target)  # the zoo's for this target, else says how to train them
    if zoo.is_zoo_name(weights):
        weights = zoo.zoo_path(weights)
    from specfamily.drafters.eagle3.formats import load_eagle3

    return _checked_layers(load_eagle3(weights, target), config.layers)


def _checked_layers(model: Eagle3Model, layers: tuple[int, ...] | None) -> Eagle3Model:
    if layers is not None and tuple(layers) != model.shape.layers:
        raise ValueError(f"eagle3 layers {list(layers)} differ from the {list(model.shape.layers)} these weights "
                         "were trained on")
    return model


def _random_vocab(ids: list[int] | None, vocab_size: int) -> DraftVocab | None:
    return None if ids is None else DraftVocab(torch.tensor(sorted(set(ids)), dtype=torch.long), vocab_size)

