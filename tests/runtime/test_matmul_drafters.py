"""Drafters on a skinny target, beside tests/runtime/test_matmul.py's eagle, medusa and small_model: self_spec (its
draft passes run the target's own layers) and prompt_lookup (no model of its own) keep the skinny target's plain
greedy text, token for token, while drafting."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specfamily as sf
from specfamily.core.target import Target
from specfamily.runtime import matmul
from specfamily.runtime.matmul import SKINNY_MAX_ROWS
from specfamily.testing.depth import DepthRecorder

VOCAB = 64
# Repeats make prompt lookup find n-grams; the rest is arbitrary.
PROMPT = [5, 9, 17, 33, 2, 40, 5, 9, 17, 33, 2, 40, 5, 9]


def _model(seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.1)  # low entropy: text that repeats, so lookups are accepted
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model.eval()


@pytest.mark.parametrize("name, options", [
    ("self_spec", {"skip": ["mlp:1"], "gamma": 3}),
    ("self_spec", {"skip": ["attn:2"], "gamma": 4}),
    ("prompt_lookup", {"gamma": 4}),
    ("prompt_lookup", {"gamma": 4, "branches": 3}),
])
def test_drafters_on_a_skinny_target_keep_its_greedy_text(monkeypatch, name, options):
    rows = []  # rows of every skinny multiplication
    original = matmul.skinny_linear

    def counting(x, weight, bias=None, max_rows=SKINNY_MAX_ROWS):
        rows.append(x.numel() // x.shape[-1])
        return original(x, weight, bias, max_rows)

    monkeypatch.setattr(matmul, "skinny_linear", counting)  # what linear_for hands out from here on
    skinny = Target(_model(seed=3), matmul="skinny")
    assert skinny.matmul == "skinny"
    greedy = sf.SamplingConfig(temperature=0.0)
    plain = sf.generate(skinny, None, PROMPT, max_new_tokens=24, sampling=greedy)
    rows.clear()
    drafter = DepthRecorder(sf.create_drafter(name, skinny, **options))
    result = sf.generate(skinny, drafter, PROMPT, max_new_tokens=24, sampling=greedy)
    assert list(result.tokens) == list(plain.tokens)
    assert result.metrics.proposed_tokens > 0 and drafter.stats.passes > 0  # it drafted ...
    assert drafter.stats.deepest_accepted >= 1  # ... and the skinny target accepted draft tokens
    assert any(1 < n <= SKINNY_MAX_ROWS for n in rows)  # verify passes over several rows went through skinny
