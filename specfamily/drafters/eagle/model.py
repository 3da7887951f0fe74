"""The EAGLE drafter network: Linear(2h -> h) over (token embedding, target feature), one decoder layer, LM head.

Input at position t is ``fc(concat(embed(x[t + 1]), f[t]))``, ``f[t]`` the target's last hidden state at t after its
final norm. One decoder layer of the target's own family turns it into a prediction of ``f[t + 1]``, which the
target's frozen LM head reads directly (the regression target is already post-norm, as in EAGLE-1). The embedding,
the LM head (and GPT-2's position table) are the target's, held outside the module tree: never trained, saved or
copied. ``input_norm=False`` drops the layer's ``input_layernorm``: the reference form, EAGLE's own layer 0.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.drafters.shared.placement import built_like, forked_rng
from specfamily.runtime.matmul import head_product

# decoder layer (config, layer_idx) + rotary embeddings handed in by the model; Mistral without a sliding window
ROPE_FAMILIES = ("llama", "qwen2", "mistral")
ABSOLUTE_FAMILIES = ("gpt2",)  # GPT2Block; learned absolute positions added to the input
SUPPORTED_FAMILIES = ROPE_FAMILIES + ABSOLUTE_FAMILIES


@dataclass(frozen=True)
class TargetParts:
    """The target's frozen modules the drafter reads: token embedding, LM head, absolute positions (GPT-2)."""

    embed: nn.Module
    lm_head: nn.Module
    positions: nn.Module | None = None


def target_family(model: PreTrainedModel) -> str:
    """The target's model_type when EAGLE can build a decoder layer of that family; else a ValueError."""
    family = model.config.get_text_config(decoder=True).model_type
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"eagle builds its decoder layer from the target's family; {family!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_FAMILIES)})"
        )
    return family


def layer_config(model: PreTrainedModel):
    """A copy of the target's text config with a single layer of full attention."""
    config = copy.deepcopy(model.config.get_text_config(decoder=True))
    config.num_hidden_layers = 1
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = ["full_attention"]
    config.use_cache = True
    return config


def target_parts(model: PreTrainedModel) -> TargetParts:
    """The target's embedding, LM head and (GPT-2) position table, frozen."""
    positions = getattr(model.get_decoder(), "wpe", None) if target_family(model) in ABSOLUTE_FAMILIES else None
    parts = TargetParts(model.get_input_embeddings(), model.get_output_embeddings(), positions)
    for module in (parts.embed, parts.lm_head, parts.positions):
        if module is not None:
            module.requires_grad_(False)
    return parts


class DraftNetwork(nn.Module):
    """What both EAGLE networks share: the draft vocabulary's index mapping (``vocab``: None drafts over all ids)."""

    vocab: DraftVocab | None

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Target token ids of positions in :meth:`logits`' last dimension (draft-vocabulary indices)."""
        return index if self.vocab is None else self.vocab.to_target(index)

    def full_q(self, q: torch.Tensor) -> torch.Tensor:
        """(..., V) a draft-vocabulary distribution (..., N) with zero outside the draft vocabulary."""
        return q if self.vocab is None else self.vocab.full_q(q)


class EagleModel(DraftNetwork):
    """fc + one decoder layer of the target's family; the target's embedding and LM head are read, not owned."""

    def __init__(self, model: PreTrainedModel, vocab: DraftVocab | None = None, input_norm: bool = True) -> None:
        super().__init__()
        self.family = target_family(model)
        config = layer_config(model)
        hidden = int(config.hidden_size)
        self.hidden_size = hidden
        self.layer_config = config
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = _decoder_layer(model, config)
        if not input_norm:
            if self.family not in ROPE_FAMILIES:
                raise ValueError(f"the eagle reference form (no input norm) is EAGLE's Llama layer 0; the target is "
                                 f"{self.family!r}")
            self.layer.input_layernorm = nn.Identity()  # EAGLE's layer 0: fc's output goes to attention as is
        self.rotary = _rotary(model, config) if self.family in ROPE_FAMILIES else None
        self.parts = target_parts(model)  # a plain attribute: not a submodule, not in state_dict()
        self.use_vocab(vocab)

    @property
    def embed(self) -> nn.Module:
        """The token embedding (the target's, or a checkpoint's own when it differs)."""
        return self.parts.embed

    @property
    def input_norm(self) -> bool:
        """Whether the decoder layer normalises its input; False: the reference (EAGLE repository) form."""
        return not isinstance(getattr(self.layer, "input_layernorm", None), nn.Identity)

    def use_vocab(self, vocab: DraftVocab | None) -> None:
        """Draft over ``vocab``'s ids only (FR-Spec: logits from the target head's rows for them); None: all."""
        device = self.parts.lm_head.weight.device
        self.vocab = None if vocab is None else vocab.to(device)  # where the drafter maps its indices
        self.head_weight = None if vocab is None else self.vocab.head_rows(self.parts.lm_head)

    def forward(
        self,
        tokens: torch.Tensor,  # (B, q) long: token t + 1 of each pair
        features: torch.Tensor,  # (B, q, H): target (or predicted) feature at t
        positions: torch.Tensor,  # (B, q) long: t
        mask: torch.Tensor | None = None,  # (1 or B, 1, q, kv) additive, or None (causal or a single query)
        cache: DynamicCache | None = None,
    ) -> torch.Tensor:
        """(B, q, H) predicted features at t + 1."""
        x = self.fc(torch.cat((self.parts.embed(tokens), features), dim=-1))
        if self.parts.positions is not None:
            x = x + self.parts.positions(positions)
        kwargs = {"attention_mask": mask, "cache": cache, "use_cache": cache is not None}
        if self.rotary is not None:
            kwargs["position_embeddings"] = self.rotary(x, positions)
            kwargs["position_ids"] = positions
        return self.layer(x, **kwargs)

    def logits(self, hidden: torch.Tensor, linear: Callable | None = None) -> torch.Tensor:
        """(..., V) the target's LM head over predicted features; (..., N) over the draft vocabulary's rows.

        ``linear``: how a single row is multiplied when drafting (``specfamily.runtime.matmul``); F.linear by default.
        """
        head = self.parts.lm_head
        if self.head_weight is not None:
            weight, bias = self.head_weight, None
        elif type(head) is nn.Linear:
            weight, bias = head.weight, head.bias
        else:
            return head(hidden)
        return head_product(hidden, weight, bias, linear)  # tree rows: read the head once (core.matmul)


def _decoder_layer(model: PreTrainedModel, config) -> nn.Module:
    """A fresh decoder layer of the target's own class, index 0."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)  # Llama-like, GPT-2
    if layers is None or len(layers) == 0:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
    return type(layers[0])(config, layer_idx=0)


def _rotary(model: PreTrainedModel, config) -> nn.Module:
    """A rotary-embedding module of the target's class over the layer config (buffers only, no weights)."""
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    if rotary is None:
        raise ValueError(f"{type(model).__name__} has no rotary embedding module")
    return type(rotary)(config=config)


def build_model(model: PreTrainedModel, seed: int = 0, vocab: DraftVocab | None = None,
                input_norm: bool = True) -> EagleModel:
    """A freshly initialised EagleModel on the target's device and dtype; ``seed`` fixes the init, global RNG kept.
    ``vocab``: draft over those target ids only; ``input_norm`` False: the reference form (no input norm)."""
    with forked_rng(model.device), built_like(model.device, model.dtype):
        torch.manual_seed(seed)
        eagle = EagleModel(model, vocab, input_norm)
    return eagle.to(device=model.device, dtype=model.dtype).eval()
