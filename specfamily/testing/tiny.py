"""Tiny random targets for tests: small vocabularies so exact distributions can be enumerated."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

FAMILIES = ("llama", "gpt2", "qwen2", "mistral")
LLAMA_LIKE = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
              "mistral": (MistralConfig, MistralForCausalLM)}  # same keyword arguments, rotary positions
FAMILY_OVERRIDES = {"mistral": {"sliding_window": None}}  # full attention (Mistral v0.2+), which Target requires


def tiny_model(
    family: str = "llama",
    vocab_size: int = 8,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    attn: str = "sdpa",
    hidden: int = 32,
    layers: int = 2,
    spread: float = 4.0,
    kv_heads: int = 2,
) -> PreTrainedModel:
    """A random causal LM whose next-token distributions are far from uniform (``spread`` scales the head);
    ``kv_heads=1`` gives the rotary families grouped-query attention (2 query heads share one KV head)."""
    torch.manual_seed(seed)
    if family in LLAMA_LIKE:
        config_class, model_class = LLAMA_LIKE[family]
        config = config_class(
            vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=2, num_key_value_heads=kv_heads, max_position_embeddings=256,
            tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
            **FAMILY_OVERRIDES.get(family, {}),
        )
        model = model_class(config)
    elif family == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=2, n_positions=256,
            tie_word_embeddings=False, eos_token_id=None, bos_token_id=None,
        )
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(f"unknown tiny family {family!r}; known: {FAMILIES}")
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(spread)
    model.config._attn_implementation = attn
    return model.to(dtype).eval()


def tiny_target(family: str = "llama", vocab_size: int = 8, seed: int = 0, dtype: torch.dtype = torch.float64,
                generation: dict | None = None, **kw):
    """A specfamily Target over :func:`tiny_model`; ``generation``: settings for the model's generation config
    (e.g. ``{"repetition_penalty": 1.3}``), the logits processors generate() and the loop then apply."""
    from specfamily.core.target import load_target

    model = tiny_model(family, vocab_size, seed, dtype, **kw)
    for name, value in (generation or {}).items():
        if not hasattr(model.generation_config, name):
            raise ValueError(f"generation config has no setting {name!r}")
        setattr(model.generation_config, name, value)
    return load_target(model)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run tiny-model work on one thread (intra-op threads only add overhead, many times over on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
