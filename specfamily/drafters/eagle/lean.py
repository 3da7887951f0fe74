"""A lean forward of the EAGLE drafter network: ``fc`` and its decoder layer on their own ops, no module calls.

A drafter call is a handful of small matrix products; on CPU the module tree (embedding, fc, rotary, decoder
layer, attention, MLP, norms: about fifteen Python module calls) and transformers' per-call helpers cost as much.
``LeanEagleLayer`` runs ``EagleModel.forward`` with the per-layer pieces of the target's lean forward
(``specfamily.runtime.lean``): the same ops in the same order on the model's own parameters, sdpa down the branch
transformers takes, and the same ``DynamicCache.update`` on layer 0, so outputs and cache contents are
bit-identical to the module path (``torch.equal``, float32 and bfloat16) and the two paths can share one cache.

Inference only: ``ready`` is False while gradients are enabled or the model trains. Rope families only (llama,
qwen2, mistral); GPT-2 and anything ``lean_eagle_unsupported`` names stay on the module path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specfamily.drafters.eagle.model import ROPE_FAMILIES, EagleModel
from specfamily.runtime.lean import LeanLayer, ModuleWatch, drafting_ready, plan_attention, rope
from specfamily.runtime.lean_support import hooked, layer_unsupported
from specfamily.runtime.matmul import Linear

__all__ = ["LeanEagleLayer", "lean_eagle_unsupported"]


def lean_eagle_unsupported(model: EagleModel) -> str | None:
    """Why ``LeanEagleLayer`` cannot reproduce ``model.forward`` exactly; None when it can."""
    if model.family not in ROPE_FAMILIES or model.rotary is None or model.parts.positions is not None:
        return f"family {model.family!r} (the lean layer covers the rope families: {', '.join(ROPE_FAMILIES)})"
    embed = model.parts.embed
    if type(embed) is not nn.Embedding or embed.max_norm is not None:
        return "the target's embedding is not a plain nn.Embedding"
    if type(model.fc) is not nn.Linear:
        return "fc is not a plain nn.Linear"
    for module in (embed, model.fc):
        if hooked(module) or "forward" in module.__dict__:
            return f"a module has hooks or a replaced forward ({type(module).__name__})"
    return layer_unsupported(model.layer, model.rotary)


class LeanEagleLayer:
    """``EagleModel.forward`` without module calls; build it only when ``lean_eagle_unsupported`` is None.

    It reads the model's parameters by reference (in-place updates, ``.to()`` and ``load_state_dict`` are seen;
    replacing ``fc``, ``layer`` or ``rotary`` needs a new one). ``ready()`` says whether a call reproduces the
    module path right now; when it is False the caller runs ``EagleModel.forward``. Hooks on the EagleModel itself
    are not watched: they run around its forward, whichever path it takes inside.
    """

    def __init__(self, model: EagleModel, linear: Linear = F.linear) -> None:
        """``linear``: how to multiply by the weights (``specfamily.runtime.matmul``; F.linear is the module path's)."""
        reason = lean_eagle_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean eagle layer cannot run this model: {reason}")
        self.model = model
        attn = model.layer.self_attn
        self._embed: torch.Tensor = model.parts.embed.weight
        self._fc = (model.fc.weight, model.fc.bias)
        self._layer = LeanLayer.of(model.layer, linear)
        self._linear = linear
        self._rotary = model.rotary
        self._attn_config = attn.config
        self._groups: int = attn.num_key_value_groups
        self._probe = torch.empty(0, attn.head_dim)  # a key row's shape, for transformers' GQA predicate
        self._watch = ModuleWatch.of((model.parts.embed, model.fc, *model.layer.modules(), model.rotary))

    def ready(self) -> bool:
        """True when a call reproduces ``EagleModel.forward`` now: no grad, eval mode, sdpa, no hooks added."""
        return drafting_ready(self.model, self._attn_config, self._watch)

    def __call__(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """(B, q, H) predicted features at t + 1, as ``EagleModel.forward(tokens, features, positions, mask, cache)``.

        ``tokens`` (B, q) long, ``features`` (B, q, H), ``positions`` (B, q) long, ``mask`` additive
        (1 or B, 1, q, kv) or None, ``cache`` a DynamicCache (keys and values appended to its layer 0) or None.
        """
        x = self._linear(torch.cat((F.embedding(tokens, self._embed), features), dim=-1), *self._fc)
        cos, sin = rope(self._rotary, x, positions)
        attend = plan_attention(mask, tokens.shape[1], self._groups, self._probe,
                                masked_gqa=self._linear is not F.linear)
        return self._layer(x, cos, sin, attend, cache)
