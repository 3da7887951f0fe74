"""Fast paths of the target wrapper: a KV cache layer that appends in place, and a lean Llama forward.

On a small model a decode step is dominated by per-call work rather than arithmetic: transformers'
DynamicLayer copies the whole cache at every append, and the module tree costs a Python call per
module. ``BufferedLayer`` writes only the new entries; ``LeanLlama`` runs a ``LlamaForCausalLM``'s own
tensor operations, in its order, on its own weights, without the module calls, so its logits are
bit-identical to the model's forward (tests compare them with ``torch.equal``). Anything the lean
forward does not cover exactly is left to the model's forward (``lean_unsupported`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as torch_module
from transformers.cache_utils import DynamicLayer

__all__ = ["BufferedLayer", "LeanLlama", "lean_unsupported"]


class BufferedLayer(DynamicLayer):
    """A DynamicLayer that appends into a preallocated buffer instead of concatenating.

    ``keys``/``values`` stay what a DynamicLayer holds, (B, H, length, D) tensors, but as views of a buffer
    with spare room along the sequence, so a pass writes only its new entries and cropping is a narrower
    view. The buffer grows by half when full. Anything that replaces ``keys`` with a tensor of its own, or
    updates with autograd or outside inference mode, takes the concatenating path, and the next update
    moves the entries into a fresh buffer.
    """

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.requires_grad or not torch.is_inference_mode_enabled():
            self._buffers = None
            return super().update(key_states, value_states, *args, **kwargs)
        length, new = (self.keys.shape[-2] if self.keys.dim() == 4 else 0), key_states.shape[-2]
        if not self._holds(key_states, length + new):
            self._grow(key_states, value_states, length, length + new)
        key_buffer, value_buffer = self._buffers
        key_buffer[:, :, length : length + new] = key_states
        value_buffer[:, :, length : length + new] = value_states
        self.keys, self.values = key_buffer[:, :, : length + new], value_buffer[:, :, : length + new]
        return self.keys, self.values

    def _holds(self, key_states: torch.Tensor, needed: int) -> bool:
        """The buffer exists, fits ``needed`` entries of this shape, and ``keys`` is still a view of its start."""
        if self._buffers is None:
            return False
        key_buffer = self._buffers[0]
        shape = key_buffer.shape
        return (
            shape[-2] >= needed
            and shape[:2] == key_states.shape[:2]
            and shape[-1] == key_states.shape[-1]
            and (self.keys.dim() != 4 or self.keys.data_ptr() == key_buffer.data_ptr())
        )

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, needed: int) -> None:
        capacity = needed + max(needed // 2, 64)
        batch, heads, _, dim = key_states.shape
        key_buffer = key_states.new_empty(batch, heads, capacity, dim)
        value_buffer = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if length:
            key_buffer[:, :, :length] = self.keys
            value_buffer[:, :, :length] = self.values
        self._buffers = (key_buffer, value_buffer)

    def reset(self) -> None:
        self._buffers = None
        super().reset()


def lean_unsupported(model: nn.Module) -> str | None:
    """Why ``LeanLlama`` cannot reproduce ``model``'s forward exactly; None when it can."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    if type(model) is not LlamaForCausalLM:
        return f"{type(model).__name__} is not a plain LlamaForCausalLM"
    config = model.config
    if config._attn_implementation != "sdpa":
        return f"attention implementation {config._attn_implementation!r} (the lean forward runs sdpa)"
    if config.num_key_value_heads != config.num_attention_heads:
        return "grouped-query attention"
    if getattr(model.model.rotary_emb, "rope_type", None) != "default":
        return "a rope type other than 'default'"
    if any(_hooked(m) for m in model.modules()):
        return "a module has hooks"
    base = model.model
    if type(base.embed_tokens) is not nn.Embedding or type(model.lm_head) is not nn.Linear:
        return "embedding or LM head is not a plain torch module"
    for layer in base.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(m) is not nn.Linear for m in linears):
            return "a projection is not a plain nn.Linear (quantised or adapted)"
        if type(layer.input_layernorm) is not LlamaRMSNorm or type(layer.post_attention_layernorm) is not LlamaRMSNorm:
            return "a norm is not LlamaRMSNorm"
    return None


_CAPTURE_MODULE = "transformers.utils.output_capturing"  # its hooks record outputs only inside the model's forward


def _blocking(hooks: dict) -> bool:
    """Any hook in ``hooks`` other than transformers' output-capturing ones (inactive outside its forward)."""
    return any(getattr(hook, "__module__", None) != _CAPTURE_MODULE for hook in hooks.values())


def _hooked(module: nn.Module) -> bool:
    return _blocking(module._forward_hooks) or _blocking(module._forward_pre_hooks) or "_hf_hook" in module.__dict__


def _global_hooks() -> bool:
    return bool(torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward, op for op (its ``.to`` calls are no-ops on float32 and skipped there)."""
    dtype = hidden.dtype
    if dtype != torch.float32:
        hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * (hidden if dtype == torch.float32 else hidden.to(dtype))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


Linear = tuple[torch.Tensor, "torch.Tensor | None"]  # weight, bias


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's parameters, gathered once (Parameters keep their identity under .to() and loading)."""

    index: int
    norm1: tuple[torch.Tensor, float]  # weight, eps
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    norm2: tuple[torch.Tensor, float]
    gate: Linear
    up: Linear
    down: Linear
    act: nn.Module
    head_dim: int
    scaling: float

    @classmethod
    def of(cls, layer: nn.Module) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        lin = lambda m: (m.weight, m.bias)  # noqa: E731
        norm = lambda m: (m.weight, m.variance_epsilon)  # noqa: E731
        return cls(
            attn.layer_idx, norm(layer.input_layernorm), lin(attn.q_proj), lin(attn.k_proj), lin(attn.v_proj),
            lin(attn.o_proj), norm(layer.post_attention_layernorm), lin(mlp.gate_proj), lin(mlp.up_proj),
            lin(mlp.down_proj), mlp.act_fn, attn.head_dim, attn.scaling,
        )

    def __call__(self, hidden, cos, sin, mask, causal: bool, cache) -> torch.Tensor:
        """LlamaDecoderLayer.forward with transformers' sdpa attention (heads == key/value heads), op for op."""
        hidden = hidden + self._attention(_rms_norm(hidden, *self.norm1), cos, sin, mask, causal, cache)
        x = _rms_norm(hidden, *self.norm2)
        return hidden + F.linear(self.act(F.linear(x, *self.gate)) * F.linear(x, *self.up), *self.down)

    def _attention(self, x, cos, sin, mask, causal: bool, cache) -> torch.Tensor:
        q_len = x.shape[1]
        shape = (1, q_len, -1, self.head_dim)
        query = F.linear(x, *self.q).view(shape).transpose(1, 2)
        key = F.linear(x, *self.k).view(shape).transpose(1, 2)
        value = F.linear(x, *self.v).view(shape).transpose(1, 2)
        query = (query * cos) + (_rotate_half(query) * sin)
        key = (key * cos) + (_rotate_half(key) * sin)
        key, value = cache.update(key, value, self.index)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, scale=self.scaling,
                                             is_causal=causal)
        out = out.reshape(out.shape[0], -1, q_len, value.shape[-1]).transpose(1, 2).contiguous()
        return F.linear(out.reshape(1, q_len, -1).contiguous(), *self.o)


class LeanLlama:
    """A ``LlamaForCausalLM`` forward without module calls; build it only when ``lean_unsupported`` is None.

    It gathers the model's parameters when built (later in-place weight updates are seen; replacing modules
    needs a new LeanLlama), and declines (``ready`` is False) while any module has hooks or the model is
    training; the caller then uses the model's forward.
    """

    def __init__(self, model: nn.Module) -> None:
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"the lean forward cannot run this model: {reason}")
        self.model = model
        base = model.model
        self._config, self._embed, self._rotary = base.config, base.embed_tokens, base.rotary_emb
        self._layers = tuple(_Layer.of(layer) for layer in base.layers)
        self._norm = (base.norm.weight, base.norm.variance_epsilon)
        self._head = (model.lm_head.weight, model.lm_head.bias)
        modules = tuple(model.modules())
        self._hooks = tuple(d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks))
        self._dicts = tuple(m.__dict__ for m in modules)

    def ready(self) -> bool:
        """True when the lean forward reproduces the model's forward right now."""
        return not (
            self.model.training
            or _global_hooks()
            or any(_blocking(hooks) for hooks in self._hooks if hooks)
            or any("_hf_hook" in d for d in self._dicts)
        )

    def __call__(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None, cache, keep: int,
        features: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (1, keep, V) of the last ``keep`` positions, last hidden state after the norm (1, q, H) or None)."""
        hidden = self._embed(input_ids)  # (1, q, H)
        cos, sin = self._rope(hidden, position_ids)
        causal = input_ids.shape[1] > 1 and mask is None
        for layer in self._layers[: self._config.num_hidden_layers]:
            hidden = layer(hidden, cos, sin, mask, causal, cache)
        hidden = _rms_norm(hidden, *self._norm)
        logits = F.linear(hidden[:, -keep:, :], *self._head)
        return logits, (hidden if features else None)

    def _rope(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LlamaRotaryEmbedding.forward (default rope type), unsqueezed for the heads: cos, sin (1, 1, q, D)."""
        rotary = self._rotary
        freqs = position_ids[..., None].float() * rotary.inv_freq.to(device=hidden.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * rotary.attention_scaling
        sin = emb.sin() * rotary.attention_scaling
        return cos.to(dtype=hidden.dtype).unsqueeze(1), sin.to(dtype=hidden.dtype).unsqueeze(1)
