"""Shared fixtures: tiny random fp32 causal LMs of the GPT-2 and Llama families (no hub, no network)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, PreTrainedModel

FAMILIES = ("gpt2", "llama")
ATTENTIONS = ("sdpa", "eager")
TINY_VOCAB = 50


def tiny_config(family: str, **overrides):
    """A 2-layer, 32-wide config with a 50-token vocabulary; weights large enough that masks matter."""
    if family == "gpt2":
        base = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=TINY_VOCAB, n_positions=128, initializer_range=0.3)
        return GPT2Config(**{**base, **overrides})
    if family == "llama":
        base = dict(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            vocab_size=TINY_VOCAB,
            max_position_embeddings=128,
            initializer_range=0.3,
        )
        return LlamaConfig(**{**base, **overrides})
    raise ValueError(f"unknown tiny model family {family!r}")


def build_tiny_model(family: str, attn: str = "sdpa", seed: int = 0, **overrides) -> PreTrainedModel:
    """A freshly initialised tiny fp32 model in eval mode; the global RNG is left untouched."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), attn_implementation=attn)
    return model.eval()


@pytest.fixture
def tiny_model() -> Callable[..., PreTrainedModel]:
    """Factory: ``tiny_model(family, attn="sdpa", seed=0, **config_overrides)``."""
    return build_tiny_model


@pytest.fixture(params=[(f, a) for f in FAMILIES for a in ATTENTIONS], ids=lambda p: f"{p[0]}-{p[1]}")
def any_tiny_model(request) -> PreTrainedModel:
    """Each tiny family under each supported attention implementation."""
    family, attn = request.param
    return build_tiny_model(family, attn)
