"""Which models the lean forward covers, and the reason it gives for each one it leaves to the model's forward."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime.lean import LeanLlama
from specfamily.runtime.lean_support import lean_unsupported
from specfamily.testing import tiny_model

VOCAB = 64
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3)  # logits far from uniform


def _build(model_class, config_class, attn: str = "sdpa", **overrides):
    model = model_class(config_class(**{**SIZES, **overrides}))
    model.config._attn_implementation = attn
    return model.eval()


class _SubclassedLlama(LlamaForCausalLM):
    pass


class _QuantisedLinear(torch.nn.Linear):
    pass


def _with(model, edit):
    edit(model)
    return model


COVERED = {
    "llama-gqa": lambda: _build(LlamaForCausalLM, LlamaConfig),
    "llama3-rope": lambda: _build(LlamaForCausalLM, LlamaConfig, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "linear-rope": lambda: _build(LlamaForCausalLM, LlamaConfig,
                                  rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "tied": lambda: _build(LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True),
    "qwen2": lambda: _build(Qwen2ForCausalLM, Qwen2Config),
    "mistral-full": lambda: _build(MistralForCausalLM, MistralConfig, sliding_window=None),
}


def _same_passes(model) -> None:
    """A prefill, a chain, a tree and a decode step, lean and through the model: logits equal bit for bit."""
    lean, plain = Target(model), Target(model, fast=False)
    assert lean.lean is not None and lean.lean.ready() and plain.lean is None
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=gen)  # noqa: E731
    steps = [(ids(9), None, []), (ids(1), Draft.chain(ids(3)), [0]),
             (ids(1), Draft(ids(4), torch.tensor([-1, 0, 0, -1])), [0, 2]), (ids(1), None, [])]
    for pending, draft, accepted in steps:
        a, b = lean.forward(pending, draft), plain.forward(pending, draft)
        assert torch.equal(a.logits, b.logits)
        lean.commit(accepted)
        plain.commit(accepted)


@pytest.mark.parametrize("name", list(COVERED))
def test_covered_models_run_the_lean_forward_bit_for_bit(name, lean_calls):
    model = COVERED[name]()
    assert lean_unsupported(model) is None
    _same_passes(model)
    assert lean_calls == [9, 4, 5, 1]  # every pass of the lean target went through the lean forward


def test_the_rope_cases_scale_their_frequencies():
    """The llama3 and linear cases really carry scaled rope frequencies (else they would test the default rope)."""
    default = COVERED["llama-gqa"]().model.rotary_emb.inv_freq
    linear = COVERED["linear-rope"]().model.rotary_emb
    assert linear.rope_type == "linear" and torch.allclose(linear.inv_freq, default / 2.0)
    llama3 = COVERED["llama3-rope"]().model.rotary_emb
    assert llama3.rope_type == "llama3" and not torch.allclose(llama3.inv_freq, default)


DECLINED = {
    "gpt2": (lambda: tiny_model("gpt2", VOCAB, dtype=torch.float32), "GPT2LMHeadModel is not one of the model classes"),
    "subclass": (lambda: _build(_SubclassedLlama, LlamaConfig), "_SubclassedLlama is not one of the model classes"),
    "eager": (lambda: tiny_model("llama", VOCAB, attn="eager"), "attention implementation 'eager'"),
    "dynamic-rope": (lambda: _build(LlamaForCausalLM, LlamaConfig,
                                    rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
                     "rope type 'dynamic' recomputes its frequencies per call"),
    "longrope": (lambda: _build(LlamaForCausalLM, LlamaConfig, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 16}), "rope type 'longrope' recomputes"),
    "mistral-window": (lambda: _build(MistralForCausalLM, MistralConfig),
                       "sliding-window attention (sliding_window=4096)"),
    "qwen2-window": (lambda: _build(Qwen2ForCausalLM, Qwen2Config, use_sliding_window=True, sliding_window=16,
                                    max_window_layers=1), "sliding-window attention"),
    "hook": (lambda: _with(_build(LlamaForCausalLM, LlamaConfig),
                           lambda m: m.model.norm.register_forward_pre_hook(lambda *a: None)),
             "a module has hooks (LlamaRMSNorm)"),
    "forward": (lambda: _with(_build(LlamaForCausalLM, LlamaConfig),
                              lambda m: setattr(m.lm_head, "forward", lambda x: x)), "a module's forward was replaced"),
    "quantised": (lambda: _with(_build(LlamaForCausalLM, LlamaConfig),
                                lambda m: setattr(m.model.layers[1].mlp, "up_proj", _QuantisedLinear(32, 64))),
                  "a projection is not a plain nn.Linear"),
    "norm": (lambda: _with(_build(LlamaForCausalLM, LlamaConfig),
                           lambda m: setattr(m.model.layers[0], "input_layernorm", torch.nn.LayerNorm(32))),
             "a norm is not a LlamaRMSNorm"),
    "rotary": (lambda: _with(_build(LlamaForCausalLM, LlamaConfig),
                             lambda m: setattr(m.model, "rotary_emb", torch.nn.Identity())),
               "the rotary embedding is a Identity"),
}


WRAPPER_REFUSES = {  # declined by the lean forward and refused by the target wrapper itself
    "mistral-window": "MistralForCausalLM uses sliding_window=4096; sliding-window and chunked attention are not "
                      "supported",
    "qwen2-window": "Qwen2ForCausalLM uses sliding_window=16; sliding-window and chunked attention are not supported",
}


@pytest.mark.parametrize("name", list(DECLINED))
def test_declined_models_use_the_model_forward_with_a_reason(name):
    build, reason = DECLINED[name]
    model = build()
    assert reason in (lean_unsupported(model) or "")
    with pytest.raises(ValueError, match="the lean forward cannot run this model"):
        LeanLlama(model)
    if name in WRAPPER_REFUSES:
        with pytest.raises(ValueError) as info:
            Target(model)
        assert str(info.value) == WRAPPER_REFUSES[name]
    else:
        assert Target(model).lean is None
