"""Lean forwards of the EAGLE networks: ``EagleModel.forward`` and ``Eagle3Model.forward`` on their own ops.

The lean layers run the same ops in the same order on the model's own parameters, with the per-layer pieces of the
target's lean forward (``specfamily.runtime.lean``), skipping the module calls that dominate a small drafter call on
CPU. With ``F.linear`` their outputs and cache contents equal the module path's bit for bit (float32 and bfloat16),
so the two paths can share one cache; with a non-exact matmul kind they differ in the last bits.

- :class:`LeanEagleLayer` (EAGLE-1/2): ``fc(concat(embed, feature))`` then the target family's decoder layer; rope
  families only (llama, qwen2, mistral); GPT-2 stays on the module path.
- :class:`LeanEagle3Layer` (EAGLE-3): ``concat(input_norm(embed), hidden_norm(g))`` through the widened Llama layer.

Inference only: ``ready`` is False while gradients are enabled or the model trains. Parameters are read by
reference (in-place updates, ``.to()`` and ``load_state_dict`` are seen; replaced modules need a new layer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specfamily.drafters.eagle.model import ROPE_FAMILIES, DraftNetwork, EagleModel
from specfamily.drafters.eagle.model3 import Eagle3Model
from specfamily.runtime.lean import LeanLayer, ModuleWatch, drafting_ready, plan_attention, rope
from specfamily.runtime.lean_support import hooked, layer_unsupported
from specfamily.runtime.matmul import Linear

__all__ = ["LeanEagle3Layer", "LeanEagleLayer", "lean_eagle3_unsupported", "lean_eagle_unsupported"]


def _embedding_unsupported(embed: nn.Module, what: str) -> str | None:
    if type(embed) is not nn.Embedding or embed.max_norm is not None:
        return f"{what} is not a plain nn.Embedding"
    return None


def _modules_unsupported(modules: tuple[nn.Module, ...], layer: nn.Module, rotary: nn.Module) -> str | None:
    """Why running ``modules`` and the decoder ``layer`` on their ops would differ from calling them; None if not."""
    for module in modules:
        if hooked(module) or "forward" in module.__dict__:
            return f"a module has hooks or a replaced forward ({type(module).__name__})"
    return layer_unsupported(layer, rotary)


def lean_eagle_unsupported(model: EagleModel) -> str | None:
    """Why ``LeanEagleLayer`` cannot reproduce ``model.forward`` exactly; None when it can."""
    if model.family not in ROPE_FAMILIES or model.rotary is None or model.parts.positions is not None:
        return f"family {model.family!r} (the lean layer covers the rope families: {', '.join(ROPE_FAMILIES)})"
    reason = _embedding_unsupported(model.embed, "the target's embedding")
    if reason is None and type(model.fc) is not nn.Linear:
        reason = "fc is not a plain nn.Linear"
    return reason or _modules_unsupported((model.embed, model.fc), model.layer, model.rotary)


def lean_eagle3_unsupported(model: Eagle3Model) -> str | None:
    """Why ``LeanEagle3Layer`` cannot reproduce ``model.forward`` exactly; None when it can."""
    reason = _embedding_unsupported(model.embed, "the token embedding")
    if reason is None and type(getattr(model.midlayer, "hidden_norm", None)) is not LlamaRMSNorm:
        reason = "the layer's hidden_norm is not a LlamaRMSNorm"
    return reason or _modules_unsupported((model.embed, model.fc, model.norm, model.lm_head), model.midlayer,
                                          model.rotary)


class _LeanDraftLayer:
    """What both lean layers hold: the embedding, the decoder layer's lean pieces, rope, attention planning and
    the watch that says whether the module path would still compute the same (``ready``)."""

    def __init__(self, model: DraftNetwork, layer: nn.Module, linear: Linear) -> None:
        self.model = model
        attn = layer.self_attn
        self._embed: torch.Tensor = model.embed.weight
        self._layer = LeanLayer.of(layer, linear)
        self._linear = linear
        self._rotary = model.rotary
        self._attn_config = attn.config
        self._groups: int = attn.num_key_value_groups
        self._probe = torch.empty(0, attn.head_dim)  # a key row's shape, for transformers' GQA predicate
        self._watch = ModuleWatch.of((model.embed, model.fc, *layer.modules(), model.rotary))

    def ready(self) -> bool:
        """True when a call reproduces the model's forward now: no grad, eval mode, sdpa, no hooks added."""
        return drafting_ready(self.model, self._attn_config, self._watch)

    def _attend(self, mask: torch.Tensor | None, queries: int):
        return plan_attention(mask, queries, self._groups, self._probe, masked_gqa=self._linear is not F.linear)


class LeanEagleLayer(_LeanDraftLayer):
    """``EagleModel.forward`` without module calls; build it only when ``lean_eagle_unsupported`` is None."""

    def __init__(self, model: EagleModel, linear: Linear = F.linear) -> None:
        """``linear``: how to multiply by the weights (``specfamily.runtime.matmul``; F.linear is the module path's)."""
        reason = lean_eagle_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean eagle layer cannot run this model: {reason}")
        super().__init__(model, model.layer, linear)
        self._fc = (model.fc.weight, model.fc.bias)

    def __call__(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                 mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """(B, q, H) predicted features at t + 1, as ``EagleModel.forward(tokens, features, positions, mask, cache)``.

        ``tokens`` (B, q) long, ``features`` (B, q, H), ``positions`` (B, q) long, ``mask`` additive
        (1 or B, 1, q, kv) or None, ``cache`` a DynamicCache (keys and values appended to its layer 0) or None.
        """
        x = self._linear(torch.cat((F.embedding(tokens, self._embed), features), dim=-1), *self._fc)
        cos, sin = rope(self._rotary, x, positions)
        return self._layer(x, cos, sin, self._attend(mask, tokens.shape[1]), cache)


class LeanEagle3Layer(_LeanDraftLayer):
    """``Eagle3Model.forward`` without module calls; build it only when ``lean_eagle3_unsupported`` is None."""

    def __init__(self, model: Eagle3Model, linear: Linear = F.linear) -> None:
        reason = lean_eagle3_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean eagle3 layer cannot run this model: {reason}")
        super().__init__(model, model.midlayer, linear)
        norm = model.midlayer.hidden_norm
        self._hidden_norm = (norm.weight, norm.variance_epsilon)
        self._before_residual = model.shape.norm_before_residual

    def __call__(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                 mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """(B, q, H) the layer's outputs, as ``Eagle3Model.forward(tokens, hidden, positions, mask, cache)``."""
        layer = self._layer
        normed = layer.norm(hidden, *self._hidden_norm)
        residual = normed if self._before_residual else hidden
        x = torch.cat((layer.norm(F.embedding(tokens, self._embed), *layer.norm1), normed), dim=-1)  # (B, q, 2H)
        cos, sin = rope(self._rotary, x, positions)
        out = residual + layer._attention(x, cos, sin, self._attend(mask, tokens.shape[1]), cache)
        y = layer.norm(out, *layer.norm2)
        linear = layer.linear
        return out + linear(layer.act(linear(y, *layer.gate)) * linear(y, *layer.up), *layer.down)
