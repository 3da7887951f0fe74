"""The target's fast paths: a lean Llama forward bit-identical to the model's; a KV layer that appends in place."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer

from specfamily.core.fast import BufferedLayer, LeanLlama, lean_unsupported
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.testing import tiny_model

VOCAB = 64


def _llama(dtype=torch.float32, **overrides) -> LlamaForCausalLM:
    config = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  max_position_embeddings=128, initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**{**config, **overrides}))
    model.config._attn_implementation = "sdpa"
    return model.to(dtype).eval()


def _passes(lean: Target, plain: Target) -> None:
    """Prefill, a chain, a tree (with a gather), one token: logits, features and caches must be equal bit for bit."""
    gen = torch.Generator().manual_seed(0)
    steps = [
        (torch.randint(0, VOCAB, (9,), generator=gen), None, []),
        (torch.randint(0, VOCAB, (1,), generator=gen), Draft.chain(torch.randint(0, VOCAB, (4,), generator=gen)), [0]),
        (torch.randint(0, VOCAB, (1,), generator=gen),
         Draft(torch.randint(0, VOCAB, (5,), generator=gen), torch.tensor([-1, 0, 0, 1, -1])), [0, 1, 3]),
        (torch.randint(0, VOCAB, (1,), generator=gen), None, []),
    ]
    for pending, draft, accepted in steps:
        a, b = lean.forward(pending, draft, features=True), plain.forward(pending, draft, features=True)
        assert torch.equal(a.logits, b.logits)
        assert torch.equal(a.features, b.features)
        lean.commit(accepted)
        plain.commit(accepted)
        for x, y in zip(lean.cache.layers, plain.cache.layers, strict=True):
            assert x.is_initialized == y.is_initialized
            assert not x.is_initialized or (torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values))


@pytest.mark.parametrize(
    "dtype, overrides",
    [(torch.float32, {}), (torch.float64, {}), (torch.float32, {"attention_bias": True, "mlp_bias": True})],
    ids=["fp32", "fp64", "biases"],
)
def test_lean_forward_equals_the_model_bit_for_bit(dtype, overrides):
    model = _llama(dtype, **overrides)
    lean, plain = Target(model), Target(model, fast=False)
    assert lean.lean is not None and plain.lean is None
    _passes(lean, plain)


def test_lean_forward_respects_a_changed_layer_count():
    """transformers' early exit shortens config.num_hidden_layers for a while; the lean forward follows it."""
    model = _llama(num_hidden_layers=3)
    lean, plain = Target(model), Target(model, fast=False)
    model.config.num_hidden_layers = 1
    try:
        _passes(lean, plain)
    finally:
        model.config.num_hidden_layers = 3


@pytest.mark.parametrize(
    "build, reason",
    [
        (lambda: tiny_model("gpt2", VOCAB, dtype=torch.float32), "GPT2LMHeadModel is not a plain LlamaForCausalLM"),
        (lambda: tiny_model("llama", VOCAB, attn="eager"), "attention implementation 'eager'"),
        (lambda: _llama(num_attention_heads=4, num_key_value_heads=2), "grouped-query attention"),
    ],
    ids=["gpt2", "eager", "gqa"],
)
def test_models_the_lean_forward_does_not_cover_use_the_model(build, reason):
    model = build()
    assert reason in lean_unsupported(model)
    assert Target(model).lean is None
    with pytest.raises(ValueError, match="the lean forward cannot run this model"):
        LeanLlama(model)


def test_a_hook_added_later_sends_passes_through_the_model():
    model = _llama()
    target = Target(model)
    assert target.lean.ready()
    calls = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *args: calls.append(1))
    try:
        assert not target.lean.ready()
        _passes(target, Target(model, fast=False))
        assert calls  # the hook ran: the pass went through the model's forward
    finally:
        handle.remove()
    assert target.lean.ready()  # transformers' own output-capturing hooks, installed by that pass, do not count
    model.train()
    assert not target.lean.ready()
    model.eval()


def _update(layer, length: int, start: int = 0):
    keys = torch.arange(start, start + length, dtype=torch.float32).view(1, 1, length, 1).expand(1, 2, length, 3)
    return layer.update(keys.clone(), -keys.clone())


@torch.inference_mode()
def test_buffered_layer_matches_dynamic_layer_and_appends_in_place():
    buffered, dynamic = BufferedLayer(), DynamicLayer()
    for start, length in ((0, 5), (5, 1), (6, 3)):
        a, b = _update(buffered, length, start), _update(dynamic, length, start)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    pointer = buffered.keys.data_ptr()
    _update(buffered, 1, 9)
    assert buffered.keys.data_ptr() == pointer  # written into the spare room, not copied
    buffered.crop(-4)
    dynamic.crop(-3)
    assert torch.equal(buffered.keys, dynamic.keys) and buffered.get_seq_length() == 6
    _update(buffered, 200, 6)  # past the capacity: a larger buffer, the old entries kept
    assert buffered.get_seq_length() == 206 and torch.equal(buffered.keys[:, :, :6], dynamic.keys)


@torch.inference_mode()
def test_buffered_layer_takes_over_a_replaced_tensor():
    layer = BufferedLayer()
    _update(layer, 4)
    layer.keys, layer.values = layer.keys[:, :, 1:].clone(), layer.values[:, :, 1:].clone()  # not a buffer view
    keys, _ = _update(layer, 2, 4)
    assert keys[0, 0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_buffered_layer_concatenates_outside_inference_mode():
    layer = BufferedLayer()
    with torch.no_grad():
        _update(layer, 3)
        keys, _ = _update(layer, 1, 3)
    assert keys[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert not keys.is_inference()
