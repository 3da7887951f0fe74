"""A lean forward of the EAGLE-3 drafter's layer: ``Eagle3Model.forward`` on its own ops, no module calls.

A drafting step is a handful of small products; on a CPU the module tree around them (embedding, rotary, three
norms, attention, MLP) and transformers' per-call helpers cost as much again. ``LeanEagle3Layer`` runs the same
ops in the same order on the model's own parameters with the per-layer pieces of the target's lean forward
(``specfamily.runtime.lean``): sdpa down the branch transformers takes and the same ``DynamicCache.update`` on layer 0.
With ``F.linear`` its outputs and cache equal the module path's bit for bit (``torch.equal``, float32 and bfloat16),
so the two can share one cache; with the target's non-exact kind (``stream``, ``skinny``) they differ in the last
bits, as the target's own products do.

Inference only: ``ready`` is False while gradients are enabled or the model trains (training takes the modules).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from specfamily.drafters.eagle3.model import Eagle3Model
from specfamily.runtime.lean import LeanLayer, ModuleWatch, drafting_ready, plan_attention, rope
from specfamily.runtime.lean_support import hooked, layer_unsupported
from specfamily.runtime.matmul import Linear

__all__ = ["LeanEagle3Layer", "lean_eagle3_unsupported"]


def lean_eagle3_unsupported(model: Eagle3Model) -> str | None:
    """Why ``LeanEagle3Layer`` cannot reproduce ``model.forward`` exactly; None when it can."""
    embed = model.embed
    if type(embed) is not nn.Embedding or embed.max_norm is not None:
        return "the token embedding is not a plain nn.Embedding"
    norm = getattr(model.midlayer, "hidden_norm", None)
    if type(norm) is not LlamaRMSNorm:
        return "the layer's hidden_norm is not a LlamaRMSNorm"
    for module in (embed, model.fc, model.norm, model.lm_head):
        if hooked(module) or "forward" in module.__dict__:
            return f"a module has hooks or a replaced forward ({type(module).__name__})"
    return layer_unsupported(model.midlayer, model.rotary)


class LeanEagle3Layer:
    """``Eagle3Model.forward`` without module calls; build it only when ``lean_eagle3_unsupported`` is None.

    It reads the parameters by reference (in-place updates and ``load_state_dict`` are seen; replacing modules
    needs a new one). When ``ready()`` is False the caller runs the module path."""

    def __init__(self, model: Eagle3Model, linear: Linear = F.linear) -> None:
        reason = lean_eagle3_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean eagle3 layer cannot run this model: {reason}")
        self.model = model
        layer, attn = model.midlayer, model.midlayer.self_attn
        self._embed: torch.Tensor = model.embed.weight
        self._layer = LeanLayer.of(layer, linear)
        self._hidden_norm = (layer.hidden_norm.weight, layer.hidden_norm.variance_epsilon)
        self._before_residual = model.shape.norm_before_residual
        self._masked_gqa = linear is not F.linear
        self._rotary = model.rotary
        self._attn_config = attn.config
        self._groups: int = attn.num_key_value_groups
        self._probe = torch.empty(0, attn.head_dim)  # a key row's shape, for transformers' GQA predicate
        self._watch = ModuleWatch.of((model.embed, model.fc, *layer.modules(), model.rotary))

    def ready(self) -> bool:
        """True when a call reproduces ``Eagle3Model.forward`` now: no grad, eval mode, sdpa, no hooks added."""
        return drafting_ready(self.model, self._attn_config, self._watch)

    def __call__(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """(B, q, H) the layer's outputs, as ``Eagle3Model.forward(tokens, hidden, positions, mask, cache)``."""
        layer = self._layer
        normed = layer.norm(hidden, *self._hidden_norm)
        residual = normed if self._before_residual else hidden
        x = torch.cat((layer.norm(F.embedding(tokens, self._embed), *layer.norm1), normed), dim=-1)  # (B, q, 2H)
        cos, sin = rope(self._rotary, x, positions)
        attend = plan_attention(mask, tokens.shape[1], self._groups, self._probe, masked_gqa=self._masked_gqa)
        out = residual + layer._attention(x, cos, sin, attend, cache)
        y = layer.norm(out, *layer.norm2)
        linear = layer.linear
        return out + linear(layer.act(linear(y, *layer.gate)) * linear(y, *layer.up), *layer.down)
