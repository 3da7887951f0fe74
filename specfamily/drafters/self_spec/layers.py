"""Run a target's decoder layers with some sub-layers skipped, over its own KV cache.

Families whose layers are pre-norm blocks ``h += attn(norm(h)); h += mlp(norm(h))``: Llama (``llama``, ``mistral``,
``qwen2``, ``qwen3``) and GPT-2. The runner calls the model's own sub-modules and is checked against the model's own
forward when built, so a family whose blocks do something else is refused. A skip set names sub-layers as
``"attn:i"``, ``"mlp:i"`` or ``"layer:i"`` (both of layer i), i from 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = (*LLAMA_FAMILY, "gpt2")
KINDS = ("attn", "mlp")
LLAMA_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ENTRY = re.compile(r"^(attn|mlp|layer):(\d+)$")

SubLayer = tuple[str, int]  # ("attn" | "mlp", layer index)


def parse_skip(entries: Iterable[str], num_layers: int) -> frozenset[SubLayer]:
    """``["attn:3", "mlp:4", "layer:5"]`` -> the set of skipped (kind, layer) sub-layers."""
    if isinstance(entries, (str, bytes)):
        raise TypeError(f"a skip list must be a list of strings like 'attn:3', got the string {entries!r}")
    skipped: set[SubLayer] = set()
    for entry in entries:
        match = _ENTRY.match(entry.strip()) if isinstance(entry, str) else None
        if match is None:
            raise ValueError(f"skip entry {entry!r} is not of the form 'attn:i', 'mlp:i' or 'layer:i'")
        kind, index = match.group(1), int(match.group(2))
        if index >= num_layers:
            raise ValueError(f"skip entry {entry!r}: layer {index} does not exist (the model has {num_layers} layers)")
        skipped.update(((k, index) for k in KINDS) if kind == "layer" else ((kind, index),))
    return frozenset(skipped)


def format_skip(skipped: Iterable[SubLayer]) -> list[str]:
    """The canonical sorted list: ``"layer:i"`` when both sub-layers of layer i are skipped."""
    skipped = set(skipped)
    out = []
    for index in sorted({i for _, i in skipped}):
        kinds = [k for k in KINDS if (k, index) in skipped]
        out += [f"layer:{index}"] if len(kinds) == len(KINDS) else [f"{k}:{index}" for k in kinds]
    return out


def all_sublayers(num_layers: int) -> list[SubLayer]:
    return [(kind, i) for i in range(num_layers) for kind in KINDS]


@contextmanager
def draft_entries_discarded(cache: DynamicCache, length: int) -> Iterator[DynamicCache]:
    """Let a draft pass append to ``cache``, then put every layer back exactly as committed.

    ``cache`` must hold ``length`` tokens in every layer. Kept attention layers append their draft entries
    (the target's cache layers decide how: a copy, or in place past the committed entries); on exit each layer
    gets back its own committed tensors (the same objects, not copies), so a layer the pass skipped, with no
    draft entries, and a kept one end alike at ``length``, and the target's next forward finds the cache as
    committed.
    """
    layers = cache.layers
    saved = []
    for i, layer in enumerate(layers):
        keys = layer.keys
        held = keys.shape[-2] if layer.is_initialized and keys is not None and keys.dim() == 4 else 0
        if held != length:
            raise RuntimeError(f"target cache layer {i} holds {held} tokens, expected the committed {length}")
        saved.append((layer, keys, layer.values, layer.is_initialized))
    try:
        yield cache
    finally:
        del layers[len(saved) :]  # layers a lazily built cache may have added
        for layer, keys, values, initialized in saved:
            layer.keys, layer.values, layer.is_initialized = keys, values, initialized


@dataclass(frozen=True)
class Block:
    """The four parts of one pre-norm decoder layer."""

    attn_norm: nn.Module
    attn: nn.Module
    mlp_norm: nn.Module
    mlp: nn.Module


@dataclass(frozen=True)
class Step:
    """One kept sub-layer in execution order: ``h = h + module(norm(h))`` (attention also gets mask and cache)."""

    is_attn: bool
    norm: nn.Module
    module: nn.Module


class LayerRunner:
    """Embedding -> the kept sub-layers -> final norm -> LM head, for one supported model."""

    def __init__(self, model: PreTrainedModel, check: bool = True) -> None:
        model_type = model.config.get_text_config(decoder=True).model_type
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"self_spec cannot skip layers of {type(model).__name__} (model_type {model_type!r}); "
                f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        self.model = model
        self.gpt2 = model_type == "gpt2"
        self.base = getattr(model, model.base_model_prefix)
        self.lm_head = model.get_output_embeddings()
        self.blocks = _blocks(self.base, self.gpt2)
        self.num_layers = len(self.blocks)
        self.final_norm = self.base.ln_f if self.gpt2 else self.base.norm
        self.dtype = self.lm_head.weight.dtype
        if check:
            check_runner(self)

    def plan(self, skipped: frozenset[SubLayer]) -> tuple[Step, ...]:
        """The kept sub-layers of ``skipped``'s complement, in execution order."""
        steps = []
        for i, block in enumerate(self.blocks):
            if ("attn", i) not in skipped:
                steps.append(Step(True, block.attn_norm, block.attn))
            if ("mlp", i) not in skipped:
                steps.append(Step(False, block.mlp_norm, block.mlp))
        return tuple(steps)

    def hidden(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache: DynamicCache | None,
        plan: tuple[Step, ...],
    ) -> torch.Tensor:
        """(1, q, H) final-normed hidden states of ids (1, q) at positions (1, q); mask (1, 1, q, kv) or None.

        Kept attention layers append their keys and values to ``cache`` (None: no cache, the ids are everything).
        """
        if self.gpt2:
            h = self.base.wte(ids) + self.base.wpe(positions)
            extras = {}
        else:
            h = self.base.embed_tokens(ids)
            extras = {"position_embeddings": self.base.rotary_emb(h, positions)}
        for step in plan:
            if step.is_attn:
                h = h + step.module(hidden_states=step.norm(h), attention_mask=mask, cache=cache, **extras)[0]
            else:
                h = h + step.module(step.norm(h))
        return self.final_norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _blocks(base: nn.Module, gpt2: bool) -> list[Block]:
    layers = getattr(base, "h" if gpt2 else "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(base).__name__} keeps no list of decoder layers where self_spec expects one")
    names = ("ln_1", "attn", "ln_2", "mlp") if gpt2 else LLAMA_PARTS
    blocks = []
    for i, layer in enumerate(layers):
        missing = [name for name in names if not isinstance(getattr(layer, name, None), nn.Module)]
        if missing:
            raise ValueError(f"decoder layer {i} ({type(layer).__name__}) has no {missing}; self_spec cannot run it")
        blocks.append(Block(*(getattr(layer, name) for name in names)))
    return blocks


@torch.inference_mode()
def check_runner(runner: LayerRunner, length: int = 5) -> None:
    """Refuse a model whose own forward differs from the runner with nothing skipped (an unsupported block)."""
    model = runner.model
    vocab = runner.lm_head.weight.shape[0]
    device = runner.lm_head.weight.device
    if device.type == "meta":  # shapes without values (a model laid out before its weights load): nothing to run
        return
    ids = (torch.arange(length, device=device) * 7 + 1).remainder(vocab).view(1, -1)
    positions = torch.arange(length, device=device).view(1, -1)
    mask = causal_mask(0, length, runner.dtype, device)
    ours = runner.logits(runner.hidden(ids, positions, mask, None, runner.plan(frozenset())))
    theirs = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    tolerance = 1e-3 if runner.dtype in (torch.float32, torch.float64) else 5e-2
    scale = theirs.abs().max().clamp(min=1.0)
    if not torch.allclose(ours.float(), theirs.float(), atol=tolerance * float(scale), rtol=0):
        raise ValueError(
            f"self_spec's layer runner does not reproduce {type(model).__name__}'s forward "
            "(its decoder blocks are not plain pre-norm attention + MLP); this model is not supported"
        )


def causal_mask(prefix: int, q: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """(1, 1, q, prefix + q) additive mask: every cached position, then causal among the q new tokens."""
    visible = torch.ones(q, prefix + q, dtype=torch.bool, device=device).tril_(diagonal=prefix)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(visible, zero, torch.finfo(dtype).min).view(1, 1, q, prefix + q)
