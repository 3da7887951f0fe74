"""Which models the lean forward (``specfamily.runtime.lean``) reproduces exactly, and why it declines the others.

Covered: Llama, Mistral and Qwen2 causal LMs (the same decoder, op for op) under sdpa attention, with multi-head or
grouped-query attention, tied or separate embeddings, biases where the family has them, and any rope type whose
frequencies transformers computes once when it builds the rotary module. Declined, with the reason: other
architectures and subclasses, other attention implementations, sliding windows, rope types that recompute their
frequencies per call, hooks, replaced forwards, hub kernels, and layers that are not the family's plain modules.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torch import nn
from torch.nn.modules import module as torch_module

__all__ = ["FAMILIES", "blocking", "global_hooks", "hooked", "layer_unsupported", "lean_unsupported"]

FAMILIES = {  # model class name -> (transformers module, class-name prefix)
    "LlamaForCausalLM": ("transformers.models.llama.modeling_llama", "Llama"),
    "MistralForCausalLM": ("transformers.models.mistral.modeling_mistral", "Mistral"),
    "Qwen2ForCausalLM": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
}
_PER_CALL_ROPE = ("longrope",)  # plus every type whose name says "dynamic": inv_freq changes with the positions
_CAPTURE_MODULE = "transformers.utils.output_capturing"  # its hooks record outputs only inside the model's forward


@dataclass(frozen=True)
class _Classes:
    """The module classes of one family."""

    causal_lm: type
    decoder_layer: type
    attention: type
    mlp: type
    norm: type
    rotary: type

    @classmethod
    def of(cls, model_class_name: str) -> _Classes:
        module_name, prefix = FAMILIES[model_class_name]
        module = importlib.import_module(module_name)
        parts = ("ForCausalLM", "DecoderLayer", "Attention", "MLP", "RMSNorm", "RotaryEmbedding")
        return cls(*(getattr(module, prefix + part) for part in parts))


def lean_unsupported(model: nn.Module) -> str | None:
    """Why the lean forward cannot reproduce ``model``'s forward exactly; None when it can."""
    name = type(model).__name__
    if name not in FAMILIES or type(model) is not _Classes.of(name).causal_lm:
        return f"{name} is not one of the model classes the lean forward covers ({', '.join(sorted(FAMILIES))})"
    classes = _Classes.of(name)
    for check in (_config_reason, _rope_reason, _hook_reason):
        reason = check(model, classes)
        if reason is not None:
            return reason
    return _modules_reason(model, classes)


def _config_reason(model: nn.Module, classes: _Classes) -> str | None:
    config = model.config
    if config._attn_implementation != "sdpa":
        return f"attention implementation {config._attn_implementation!r} (the lean forward runs sdpa)"
    if getattr(config, "sliding_window", None) is not None:
        return f"sliding-window attention (sliding_window={config.sliding_window})"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return f"layer types {sorted(set(layer_types) - {'full_attention'})} (only full attention is covered)"
    if getattr(model, "_use_kernels", False):
        return "the model uses hub kernels"
    return None


def layer_unsupported(layer: nn.Module, rotary: nn.Module) -> str | None:
    """Why the lean layer (``specfamily.runtime.lean.LeanLayer``) cannot reproduce a lone decoder layer called with
    ``rotary``'s position embeddings exactly; None when it can. The layer's own config must say sdpa."""
    classes = next((c for c in map(_Classes.of, FAMILIES) if type(layer) is c.decoder_layer), None)
    if classes is None:
        return f"{type(layer).__name__} is not the decoder layer of a family the lean forward covers"
    implementation = layer.self_attn.config._attn_implementation
    if implementation != "sdpa":
        return f"attention implementation {implementation!r} (the lean forward runs sdpa)"
    reason = _rotary_reason(rotary, classes)
    if reason is not None:
        return reason
    for module in (*layer.modules(), rotary):
        if hooked(module) or "forward" in module.__dict__:
            return f"a module has hooks or a replaced forward ({type(module).__name__})"
    return _layer_reason(layer, classes)


def _rope_reason(model: nn.Module, classes: _Classes) -> str | None:
    return _rotary_reason(model.model.rotary_emb, classes)


def _rotary_reason(rotary: nn.Module, classes: _Classes) -> str | None:
    if type(rotary) is not classes.rotary:
        return f"the rotary embedding is a {type(rotary).__name__}, not a plain {classes.rotary.__name__}"
    rope_type = getattr(rotary, "rope_type", None)
    if not isinstance(rope_type, str):
        return f"rope type {rope_type!r} (one rope type for every layer is covered)"
    if "dynamic" in rope_type or rope_type in _PER_CALL_ROPE:
        return f"rope type {rope_type!r} recomputes its frequencies per call"
    return None


def _hook_reason(model: nn.Module, classes: _Classes) -> str | None:
    for module in model.modules():
        if hooked(module):
            return f"a module has hooks ({type(module).__name__})"
        if "forward" in module.__dict__:
            return f"a module's forward was replaced ({type(module).__name__})"
    return None


def _modules_reason(model: nn.Module, classes: _Classes) -> str | None:
    base = model.model
    if type(base.embed_tokens) is not nn.Embedding or type(model.lm_head) is not nn.Linear:
        return "embedding or LM head is not a plain torch module"
    if type(base.norm) is not classes.norm:
        return f"the final norm is not a {classes.norm.__name__}"
    for layer in base.layers:
        reason = _layer_reason(layer, classes)
        if reason is not None:
            return reason
    return None


def _layer_reason(layer: nn.Module, classes: _Classes) -> str | None:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if type(layer) is not classes.decoder_layer or type(attn) is not classes.attention or type(mlp) is not classes.mlp:
        return f"a decoder layer is not the family's plain {classes.decoder_layer.__name__}"
    if getattr(attn, "sliding_window", None) is not None:
        return f"layer {attn.layer_idx} attends within a sliding window"
    linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if any(type(m) is not nn.Linear for m in linears):
        return "a projection is not a plain nn.Linear (quantised or adapted)"
    if type(layer.input_layernorm) is not classes.norm or type(layer.post_attention_layernorm) is not classes.norm:
        return f"a norm is not a {classes.norm.__name__}"
    return None


def blocking(hooks: dict) -> bool:
    """Any hook in ``hooks`` other than transformers' output-capturing ones (inactive outside its forward)."""
    return any(getattr(hook, "__module__", None) != _CAPTURE_MODULE for hook in hooks.values())


def hooked(module: nn.Module) -> bool:
    """The module has forward hooks that would run (or an accelerate hook)."""
    return blocking(module._forward_hooks) or blocking(module._forward_pre_hooks) or "_hf_hook" in module.__dict__


def global_hooks() -> bool:
    """torch has global forward hooks registered."""
    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)
