"""The EAGLE-3 drafter network (Li et al. 2025), laid out as the EAGLE repository and SpecForge save it.

``fc`` fuses the target's hidden states of k layers at t (k * h -> h, no bias) into g. One Llama decoder layer
(q/k/v widened to 2h, plus ``hidden_norm``) reads ``concat(input_layernorm(embed(x[t + 1])), hidden_norm(g))``,
g being the layer's own output at the parent when drafting further; the residual is g (or its norm with
``norm_before_residual``). Then its own ``norm`` and ``lm_head`` over a draft vocabulary (draft index i -> target id
``vocab.ids[i]``). Module names match the reference checkpoints (``fc``, ``midlayer.*``, ``norm``, ``lm_head``,
``embed_tokens`` only when a checkpoint carries its own; otherwise the target's embedding is read, frozen).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from specfamily.drafters.eagle.model import DraftNetwork
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.drafters.shared.placement import built_like, forked_rng
from specfamily.runtime.matmul import head_product

__all__ = ["Eagle3Model", "Eagle3Shape", "build_model", "default_layers", "draft_layer_config"]


@dataclass(frozen=True)
class Eagle3Shape:
    """What fixes an EAGLE-3 network's tensors: the draft layer's config and the number of fused target layers."""

    config: LlamaConfig  # the draft decoder layer (hidden size = the target's)
    layers: tuple[int, ...]  # target feature layers (transformers' hidden_states indexing)
    norm_before_residual: bool = False


def default_layers(num_layers: int) -> tuple[int, ...]:
    """The reference's feature layers (2, L // 2, L - 3) (EAGLE, vLLM, speculators); on targets too shallow for
    three distinct ones in [0, L], the embeddings, the middle and the final state (0, L // 2, L)."""
    reference = (2, num_layers // 2, num_layers - 3)
    if len(set(reference)) == 3 and all(0 <= i <= num_layers for i in reference):
        return reference
    return (0, num_layers // 2, num_layers)


def draft_layer_config(model: PreTrainedModel) -> LlamaConfig:
    """A one-layer Llama config with the target's dimensions, norm epsilon, rope and context length."""
    text = model.config.get_text_config(decoder=True)
    hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
    rope = getattr(text, "rope_parameters", None)
    config = LlamaConfig(
        vocab_size=int(model.get_output_embeddings().weight.shape[0]),
        hidden_size=hidden,
        intermediate_size=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
        rms_norm_eps=float(getattr(text, "rms_norm_eps", None) or 1e-6),
        max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 2048),
        rope_parameters=dict(rope) if isinstance(rope, dict) else None,
        tie_word_embeddings=False,
    )
    return config


class Eagle3Model(DraftNetwork):
    """fc + one widened Llama layer + norm + draft LM head; the target's embedding is read unless owned."""

    def __init__(self, shape: Eagle3Shape, embed: nn.Module, vocab: DraftVocab | None) -> None:
        super().__init__()
        config = shape.config
        config._attn_implementation = "sdpa"
        hidden = int(config.hidden_size)
        self.hidden_size, self.shape = hidden, shape
        self.fc = nn.Linear(len(shape.layers) * hidden, hidden, bias=False)
        self.midlayer = _midlayer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        vocab_size = int(config.vocab_size)
        self.lm_head = nn.Linear(hidden, vocab_size if vocab is None else vocab.size, bias=False)
        self.rotary = LlamaRotaryEmbedding(config=config)
        self.embed_tokens: nn.Embedding | None = None  # set only when a checkpoint carries its own embedding
        self.target_embed = (embed,)  # a tuple: read, not a submodule, not in state_dict()
        self.vocab = vocab

    @property
    def embed(self) -> nn.Module:
        return self.embed_tokens if self.embed_tokens is not None else self.target_embed[0]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(..., H) fused feature of the target's (..., k * H) layer features."""
        return self.fc(features)

    def forward(
        self,
        tokens: torch.Tensor,  # (B, q) long target ids: token t + 1 of each pair
        hidden: torch.Tensor,  # (B, q, H): fused target feature at t, or the layer's own output at the parent
        positions: torch.Tensor,  # (B, q) long: t
        mask: torch.Tensor | None = None,  # (1 or B, 1, q, kv) additive, or None (causal or a single query)
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """(B, q, H) the layer's output (before ``norm``): what the next step reads and the head predicts from."""
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        residual = normed if self.shape.norm_before_residual else hidden
        x = torch.cat((layer.input_layernorm(self.embed(tokens)), normed), dim=-1)  # (B, q, 2H)
        attended, _ = layer.self_attn(x, position_embeddings=self.rotary(x, positions), attention_mask=mask,
                                      cache=cache, position_ids=positions)
        out = residual + attended
        return out + layer.mlp(layer.post_attention_layernorm(out))

    def logits(self, hidden: torch.Tensor, linear: Callable | None = None) -> torch.Tensor:
        """(..., N) draft-vocabulary logits of layer outputs (..., H); N = V without a draft vocabulary.
        ``linear``: how to multiply by the head (``specfamily.runtime.matmul.head_product``; F.linear by default)."""
        return head_product(self.norm(hidden), self.lm_head.weight, None, linear)  # tree rows: head read once



def _midlayer(config: LlamaConfig) -> nn.Module:
    """A LlamaDecoderLayer whose q/k/v read 2h and with a ``hidden_norm``, as the reference's ``midlayer``."""
    layer = LlamaDecoderLayer(config, layer_idx=0)
    attn, wide = layer.self_attn, 2 * int(config.hidden_size)
    for name in ("q_proj", "k_proj", "v_proj"):
        old = getattr(attn, name)
        setattr(attn, name, nn.Linear(wide, old.out_features, bias=old.bias is not None))
    layer.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return layer


def build_model(
    model: PreTrainedModel, shape: Eagle3Shape, vocab: DraftVocab | None = None, seed: int | None = 0
) -> Eagle3Model:
    """An Eagle3Model for the target ``model``; ``seed`` None leaves the init to the caller (weights are loaded
    next), else a fresh init anchored to the target (:func:`anchor_to_target`)."""
    embed = model.get_input_embeddings()
    embed.requires_grad_(False)
    with forked_rng(model.device), built_like(model.device, model.dtype):
        if seed is not None:
            torch.manual_seed(seed)
        eagle = Eagle3Model(shape, embed, vocab)
    if seed is not None:
        anchor_to_target(eagle, model.get_output_embeddings().weight.detach(), vocab)
    eagle.vocab = None if vocab is None else vocab.to(model.device)
    return eagle.to(device=model.device, dtype=model.dtype).eval()


ANCHOR_SCALE = 0.1  # the random parts' scale in an anchored init: every path is exercised, none dominates


@torch.no_grad()
def anchor_to_target(eagle: Eagle3Model, head: torch.Tensor, vocab: DraftVocab | None) -> None:
    """Start near the target: the LM head is the target head's rows for the draft vocabulary, ``fc`` passes the
    highest feature layer through (plus small random weights on the others) and the layer's attention and MLP
    outputs are scaled down, so a fresh drafter predicts roughly what the target's highest feature layer says.
    A random drafter then proposes tokens the target finds likely often enough to test deep drafts, and training
    starts from there."""
    eagle.lm_head.weight.copy_(head if vocab is None else vocab.head_weight(head))
    hidden = eagle.hidden_size
    top = max(range(len(eagle.shape.layers)), key=lambda i: eagle.shape.layers[i])
    eagle.fc.weight.mul_(ANCHOR_SCALE)
    eagle.fc.weight[:, top * hidden : (top + 1) * hidden] += torch.eye(hidden, dtype=eagle.fc.weight.dtype)
    eagle.midlayer.self_attn.o_proj.weight.mul_(ANCHOR_SCALE)
    eagle.midlayer.mlp.down_proj.weight.mul_(ANCHOR_SCALE)
