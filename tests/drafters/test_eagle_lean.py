"""The lean EAGLE layer: outputs and DynamicCache contents bit-identical to ``EagleModel.forward``."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import specfamily.runtime.lean as core_lean
from specfamily.core.tree_mask import additive, attention_mask, local_mask
from specfamily.drafters.eagle.lean import LeanEagleLayer, lean_eagle_unsupported
from specfamily.drafters.eagle.model import EagleModel, build_model
from specfamily.drafters.shared.feature_drafting import crop
from specfamily.testing import tiny_model
from specfamily.testing.tiny import single_thread

VOCAB, HIDDEN = 128, 64
FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM)}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
CASES = {
    "llama-gqa": ("llama", {"num_key_value_heads": 2}),
    "llama-mha": ("llama", {"num_key_value_heads": 4}),
    "llama3-rope-biases": ("llama", {"num_key_value_heads": 2, "rope_parameters": LLAMA3, "attention_bias": True,
                                     "mlp_bias": True}),
    "qwen2-gqa": ("qwen2", {"num_key_value_heads": 2}),  # q/k/v biases
    "mistral-gqa": ("mistral", {"num_key_value_heads": 2, "sliding_window": None}),
}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def _eagle(family: str = "llama", dtype=torch.float32, **overrides) -> EagleModel:
    """An EagleModel over a random 1-layer target: hidden 64, 4 query heads, random biases and norm weights."""
    config_class, model_class = FAMILIES[family]
    config = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1,
                  num_attention_heads=4, max_position_embeddings=256, initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        target = model_class(config_class(**{**config, **overrides}))
        target.config._attn_implementation = "sdpa"
        eagle = build_model(target.to(dtype).eval(), seed=1)
        with torch.no_grad():
            for name, parameter in eagle.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    parameter.add_(torch.randn_like(parameter) * 0.3)
    return eagle


def _tree_mask(rows: torch.Tensor, real: int, dtype) -> torch.Tensor:
    """TreeFeeder.step's mask: every committed entry visible, then ``rows`` (k, fed + k) over the fed nodes."""
    mask = torch.zeros(1, 1, rows.shape[0], real + rows.shape[1], dtype=dtype)
    mask[0, 0, :, real:] = additive(rows, dtype)
    return mask


def _calls(dtype, gen: torch.Generator):
    """(tokens, features, positions, mask, crop_to) of a drafter's calls: catch-ups, a chain, a tree."""
    ids = lambda n: torch.randint(0, VOCAB, (1, n), generator=gen)  # noqa: E731
    feats = lambda n: torch.randn(1, n, HIDDEN, generator=gen).to(dtype)  # noqa: E731
    span = lambda a, b: torch.arange(a, b)[None]  # noqa: E731
    depth = lambda k, p: torch.full((1, k), p, dtype=torch.long)  # noqa: E731
    catch_up = lambda start, m: attention_mask(start, local_mask(m, [], dtype))  # noqa: E731
    depth2 = torch.tensor([[1, 0, 0, 1, 0, 0, 1], [1, 0, 0, 0, 1, 0, 0]], dtype=torch.bool)
    return [
        (ids(6), feats(6), span(0, 6), catch_up(0, 6), None),  # prefix
        (ids(3), feats(3), span(6, 9), catch_up(6, 3), None),  # (a) catch-up after a prefix
        (ids(1), feats(1), span(9, 10), None, None),  # (b) chain: one query, no mask
        (ids(1), feats(1), span(10, 11), None, None),
        (ids(5), feats(5), depth(5, 9), _tree_mask(torch.eye(5, dtype=torch.bool), 9, dtype), 9),  # (c) tree
        (ids(2), feats(2), depth(2, 10), _tree_mask(depth2, 9, dtype), None),
        (ids(1), feats(1), depth(1, 11), _tree_mask(torch.tensor([[1, 0, 0, 0, 0, 1, 0, 1]]).bool(), 9, dtype),
         None),  # one node under a mask: the packed-GQA branch
    ]


def _same_cache(a: DynamicCache, b: DynamicCache) -> bool:
    x, y = a.layers[0], b.layers[0]
    return torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)


@DTYPES
@pytest.mark.parametrize("case", list(CASES))
def test_lean_layer_equals_the_module_bit_for_bit(case, dtype):
    family, overrides = CASES[case]
    eagle = _eagle(family, dtype, **overrides)
    lean = LeanEagleLayer(eagle)
    module_cache, lean_cache = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        assert lean.ready()
        for tokens, features, positions, mask, crop_to in _calls(dtype, torch.Generator().manual_seed(0)):
            if crop_to is not None:
                crop(module_cache, crop_to)
                crop(lean_cache, crop_to)
            expected = eagle(tokens, features, positions, mask, module_cache)
            got = lean(tokens, features, positions, mask, lean_cache)
            assert got.dtype == dtype and torch.equal(got, expected)
            assert _same_cache(lean_cache, module_cache)


@DTYPES
def test_module_and_lean_calls_mix_on_one_cache(dtype):
    eagle = _eagle("llama", dtype, num_key_value_heads=2)
    lean = LeanEagleLayer(eagle)
    module_cache, mixed_cache = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        for i, (tokens, features, positions, mask, crop_to) in enumerate(_calls(dtype, torch.Generator())):
            if crop_to is not None:
                crop(module_cache, crop_to)
                crop(mixed_cache, crop_to)
            forward = lean if i % 2 else eagle
            assert torch.equal(forward(tokens, features, positions, mask, mixed_cache),
                               eagle(tokens, features, positions, mask, module_cache))
            assert _same_cache(mixed_cache, module_cache)


@DTYPES
def test_the_calls_take_each_sdpa_branch(dtype, monkeypatch):
    """The sequence runs transformers' packed, repeated and plain-GQA branches (not one branch throughout)."""
    seen: set[str] = set()
    original = core_lean.plan_attention

    def recorded(*args, **options):
        attend = original(*args, **options)
        seen.add("pack" if attend.pack else "gqa" if attend.gqa else "repeat")
        return attend

    monkeypatch.setattr("specfamily.drafters.eagle.lean.plan_attention", recorded)
    eagle = _eagle("llama", dtype, num_key_value_heads=2)
    lean, cache = LeanEagleLayer(eagle), DynamicCache()
    with torch.inference_mode():
        for tokens, features, positions, mask, crop_to in _calls(dtype, torch.Generator()):
            if crop_to is not None:
                crop(cache, crop_to)
            lean(tokens, features, positions, mask, cache)
    assert seen == {"pack", "gqa", "repeat"}


@DTYPES
def test_without_a_cache_and_with_a_batch(dtype):
    """A causal pass of a batch without a cache (as in training, here without gradients)."""
    eagle = _eagle("qwen2", dtype, num_key_value_heads=2)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 7), generator=gen)
    features = torch.randn(2, 7, HIDDEN, generator=gen).to(dtype)
    positions = torch.arange(7).expand(2, -1)
    with torch.no_grad():
        assert torch.equal(LeanEagleLayer(eagle)(tokens, features, positions), eagle(tokens, features, positions))


def test_several_queries_without_a_mask_over_a_cache_follow_the_module():
    """transformers' sdpa then attends causally to the first q keys; the lean layer does the same."""
    eagle = _eagle("llama", num_key_value_heads=2)
    lean, module_cache, lean_cache = LeanEagleLayer(eagle), DynamicCache(), DynamicCache()
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for start, q in ((0, 5), (5, 3)):
            args = (torch.randint(0, VOCAB, (1, q), generator=gen), torch.randn(1, q, HIDDEN, generator=gen),
                    torch.arange(start, start + q)[None], None)
            assert torch.equal(lean(*args, lean_cache), eagle(*args, module_cache))
            assert _same_cache(lean_cache, module_cache)


def test_weights_are_read_by_reference():
    eagle = _eagle("llama", num_key_value_heads=2)
    lean = LeanEagleLayer(eagle)
    with torch.no_grad():
        eagle.fc.weight.mul_(1.5)
        eagle.layer.mlp.down_proj.weight.add_(0.1)
        eagle.to(torch.bfloat16)
        eagle.parts.embed.to(torch.bfloat16)  # the target's, outside the module tree
    gen = torch.Generator().manual_seed(3)
    args = (torch.randint(0, VOCAB, (1, 4), generator=gen), torch.randn(1, 4, HIDDEN, generator=gen).bfloat16(),
            torch.arange(4)[None])
    with torch.inference_mode():
        assert torch.equal(lean(*args), eagle(*args))


def test_unsupported_models_are_refused_with_the_reason():
    gpt2 = build_model(tiny_model("gpt2", VOCAB, dtype=torch.float32))
    assert "family 'gpt2'" in lean_eagle_unsupported(gpt2)
    with pytest.raises(ValueError, match="cannot run this model: family 'gpt2'"):
        LeanEagleLayer(gpt2)
    eager = build_model(tiny_model("llama", VOCAB, dtype=torch.float32, attn="eager"))
    assert "attention implementation 'eager'" in lean_eagle_unsupported(eager)
    hooked = _eagle()
    hooked.layer.mlp.register_forward_hook(lambda *args: None)
    assert "hooks" in lean_eagle_unsupported(hooked)
    assert lean_eagle_unsupported(_eagle()) is None


@pytest.mark.parametrize("change", ["grad", "train", "hook", "eager", "forward"])
def test_ready_is_false_while_the_module_path_differs(change):
    eagle = _eagle()
    lean = LeanEagleLayer(eagle)
    with torch.inference_mode():
        assert lean.ready()
    if change == "grad":
        assert not lean.ready()  # gradients enabled: training keeps the module path
        return
    with torch.inference_mode():
        if change == "train":
            eagle.train()
        elif change == "hook":
            eagle.layer.self_attn.q_proj.register_forward_pre_hook(lambda *args: None)
        elif change == "eager":
            eagle.layer_config._attn_implementation = "eager"
        else:
            eagle.fc.forward = lambda x: x
        assert not lean.ready()
