"""Architectures of the zoo's models (Llama family, tied embeddings, 1024 positions)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    intermediate: int


SHAPES = {
    "target": ModelShape(layers=6, hidden=384, heads=6, intermediate=1024),
    "draft": ModelShape(layers=1, hidden=192, heads=3, intermediate=512),
    "tiny": ModelShape(layers=2, hidden=32, heads=2, intermediate=64),  # tests only
}


def llama_config(kind: str, vocab_size: int, max_positions: int = 1024) -> LlamaConfig:
    if kind not in SHAPES:
        raise ValueError(f"unknown zoo model kind {kind!r}; known: {sorted(SHAPES)}")
    shape = SHAPES[kind]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
