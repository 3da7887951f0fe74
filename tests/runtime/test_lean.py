"""The lean forward: logits bit-identical to the model's forward for Llama, Qwen2 and Mistral, MHA and GQA."""

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

import specfamily as sf
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime.lean import plan_attention
from specfamily.testing import tiny_model

VOCAB = 64
FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "mistral": (MistralConfig, MistralForCausalLM)}
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def _model(family: str = "llama", dtype=torch.float32, kv_heads: int = 4, **overrides):
    """A random 2-layer model, 4 query heads, random biases where it has them, sdpa attention."""
    config_class, model_class = FAMILIES[family]
    config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=kv_heads, max_position_embeddings=128, initializer_range=0.3)
    if family == "mistral":
        config["sliding_window"] = None
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config_class(**{**config, **overrides}))
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.normal_(std=0.3)
    model.config._attn_implementation = "sdpa"
    return model.to(dtype).eval()


def _targets(model) -> tuple[Target, Target]:
    lean_target, plain = Target(model), Target(model, fast=False)
    assert lean_target.lean is not None and lean_target.lean.ready() and plain.lean is None
    return lean_target, plain


def _assert_same_cache(a: Target, b: Target) -> None:
    for x, y in zip(a.cache.layers, b.cache.layers, strict=True):
        assert x.is_initialized == y.is_initialized
        assert not x.is_initialized or (torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values))


def _passes(lean_target: Target, plain: Target) -> None:
    """Prefill, a chain, a tree (with a gather), decode steps: logits, features and caches equal bit for bit."""
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=gen)  # noqa: E731
    steps = [
        (ids(9), None, []),
        (ids(1), Draft.chain(ids(4)), [0]),
        (ids(1), Draft(ids(5), torch.tensor([-1, 0, 0, 1, -1])), [0, 1, 3]),
        (ids(1), None, []),
        (ids(1), None, []),
    ]
    for pending, draft, accepted in steps:
        a, b = lean_target.forward(pending, draft, features=True), plain.forward(pending, draft, features=True)
        assert torch.equal(a.logits, b.logits)
        assert torch.equal(a.features, b.features)
        lean_target.commit(accepted)
        plain.commit(accepted)
        _assert_same_cache(lean_target, plain)


CASES = {
    "llama-mha": ("llama", {}),
    "llama-gqa": ("llama", {"kv_heads": 2}),
    "llama-mqa": ("llama", {"kv_heads": 1}),
    "qwen2-mha": ("qwen2", {}),
    "qwen2-gqa": ("qwen2", {"kv_heads": 2}),
    "mistral-gqa": ("mistral", {"kv_heads": 2}),
    "llama3-rope": ("llama", {"kv_heads": 2, "rope_parameters": LLAMA3}),
    "yarn-rope": ("llama", {"kv_heads": 2, "rope_parameters": YARN}),
    "tied": ("llama", {"kv_heads": 2, "tie_word_embeddings": True}),
    "biases": ("llama", {"kv_heads": 2, "attention_bias": True, "mlp_bias": True}),
    "head-dim-320": ("llama", {"kv_heads": 2, "head_dim": 320}),  # over 256: no enable_gqa, even unmasked
}


@DTYPES
@pytest.mark.parametrize("case", list(CASES))
def test_lean_forward_equals_the_model_bit_for_bit(case, dtype, lean_calls):
    family, overrides = CASES[case]
    model = _model(family, dtype, **overrides)
    _passes(*_targets(model))
    assert lean_calls == [9, 5, 6, 1, 1]


@DTYPES
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_tiny_gqa_models_of_each_family(family, dtype, lean_calls):
    _passes(*_targets(tiny_model(family, VOCAB, dtype=dtype, kv_heads=1)))
    assert len(lean_calls) == 5


def test_the_cases_exercise_what_they_name():
    """Scaled rope frequencies differ from the default ones; tied embeddings share one weight."""
    default = _model().model.rotary_emb
    for rope in (LLAMA3, YARN):
        rotary = _model(rope_parameters=rope).model.rotary_emb
        assert not torch.equal(rotary.inv_freq, default.inv_freq) or rotary.attention_scaling != 1.0
    tied = _model(tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


@pytest.mark.parametrize("head_dim, masked, q_len, branch", [
    (16, False, 9, "gqa causal"),  # prefill: transformers leaves the mask out
    (16, False, 1, "gqa"),  # one-token decode
    (16, True, 1, "pack"),  # one token with a mask
    (16, True, 6, "repeat"),  # a tree pass
    (320, False, 9, "repeat causal"),
    (320, False, 1, "pack"),
])
def test_plan_attention_takes_transformers_sdpa_branch(head_dim, masked, q_len, branch):
    mask = torch.zeros(1, 1, q_len, 12) if masked else None
    attend = plan_attention(mask, q_len, 2, torch.empty(0, head_dim))
    taken = "gqa" if attend.gqa else "pack" if attend.pack else "repeat"
    assert (f"{taken} causal" if attend.causal else taken) == branch
    assert plan_attention(mask, q_len, 1, torch.empty(0, head_dim)).groups == 1  # MHA: sdpa as is


@pytest.mark.parametrize("masked, q_len, branch", [
    (True, 6, "gqa"),  # a drafter's verify-shaped pass: the key heads indexed, not repeated
    (True, 1, "pack"),  # one token keeps the packed branch
    (False, 9, "gqa causal"),
])
def test_plan_attention_for_non_exact_kinds_indexes_grouped_heads(masked, q_len, branch):
    mask = torch.zeros(1, 1, q_len, 12) if masked else None
    attend = plan_attention(mask, q_len, 2, torch.empty(0, 16), masked_gqa=True)
    taken = "gqa" if attend.gqa else "pack" if attend.pack else "repeat"
    assert (f"{taken} causal" if attend.causal else taken) == branch


@pytest.mark.parametrize("masked, q_len, shape", [(True, 6, (1, 1, 12, 12)), (True, 1, (1, 1, 1, 12))])
def test_plan_attention_packs_the_queries_of_a_masked_pass_when_asked(masked, q_len, shape):
    """pack_queries: the grouped query heads become rows of their key head, the mask's rows repeated per group."""
    mask = torch.randn(1, 1, q_len, 12)
    attend = plan_attention(mask, q_len, 2, torch.empty(0, 16), masked_gqa=True, pack_queries=True)
    assert attend.pack and not attend.gqa and not attend.causal and tuple(attend.mask.shape) == shape
    if q_len > 1:
        assert torch.equal(attend.mask[0, 0, :q_len], mask[0, 0]) and torch.equal(attend.mask[0, 0, q_len:], mask[0, 0])
    assert plan_attention(mask, q_len, 2, torch.empty(0, 16), pack_queries=True).pack == (q_len == 1)  # exact: never


# exact repeats the keys and values as transformers does; the non-exact kinds fold each key head's query heads into
# its rows (pack: 2 query rows-of-heads of 2 key heads), the sdpa call of the target's verify pass
@pytest.mark.parametrize("kind, key_heads, gqa", [("exact", 4, False), ("skinny", 2, False)])
def test_a_verify_pass_copies_the_key_heads_only_under_exact(kind, key_heads, gqa, monkeypatch):
    """exact repeats the keys and values as transformers does; the non-exact kinds run the 4 query heads as rows of
    the 2 key heads, with logits within float32 rounding of the model's."""
    model = _model(kv_heads=2)
    target, plain = Target(model, matmul=kind), Target(model, fast=False)
    assert target.lean is not None and target.matmul == kind
    real, calls = torch.nn.functional.scaled_dot_product_attention, []

    def spy(query, key, value, **options):
        calls.append((query.shape[1], key.shape[1], options.get("enable_gqa"), options.get("attn_mask") is not None))
        return real(query, key, value, **options)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    for t in (target, plain):
        t.forward(torch.arange(9) % VOCAB)
        t.commit([])
    calls.clear()
    draft = Draft(torch.tensor([3, 5, 7, 11]), torch.tensor([-1, 0, 0, 1]))
    logits = target.forward(torch.tensor([2]), draft).logits
    assert calls == [(key_heads, key_heads, gqa, True)] * 2  # one call per layer, masked
    torch.testing.assert_close(logits, plain.forward(torch.tensor([2]), draft).logits, rtol=1e-5, atol=1e-5)


@DTYPES
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_one_token_with_a_mask_matches_the_model(family, dtype):
    """The packed single-query branch (a mask and one token), called directly as the model would be."""
    model = _model(family, dtype, kv_heads=2)
    lean_target, plain = _targets(model)
    for target in (lean_target, plain):
        target.forward(torch.arange(7) % VOCAB)
        target.commit([])
    token, position = torch.tensor([[5]]), torch.tensor([[7]])
    mask = torch.zeros(1, 1, 1, 8, dtype=dtype)
    mask[..., 2] = torch.finfo(dtype).min  # hide one cached position
    with torch.inference_mode():
        logits, _ = lean_target.lean(token, position, mask, lean_target.cache, 1)
        expected = model(input_ids=token, attention_mask=mask, position_ids=position, cache=plain.cache,
                         use_cache=True).logits
    assert torch.equal(logits, expected)
    _assert_same_cache(lean_target, plain)


def test_several_tokens_over_a_cache_need_a_mask():
    lean_target, _ = _targets(_model())
    lean_target.forward(torch.arange(4))
    lean_target.commit([])
    with torch.inference_mode(), pytest.raises(ValueError, match="needs a mask"):
        lean_target.lean(torch.tensor([[1, 2]]), torch.tensor([[3, 4]]), None, lean_target.cache, 1)


@DTYPES
def test_greedy_generation_is_the_same_token_for_token(dtype, lean_calls):
    model = _model("llama", dtype, kv_heads=2, num_hidden_layers=3)
    lean_target, plain = _targets(model)
    prompt = [3, 17, 42, 8, 8, 30, 1]
    ours = sf.generate(lean_target, None, prompt, max_new_tokens=24)
    assert len(lean_calls) == 24
    assert ours.tokens == sf.generate(plain, None, prompt, max_new_tokens=24).tokens
    assert len(lean_calls) == 24  # the plain target never took the lean path


def test_lean_forward_respects_a_changed_layer_count(lean_calls):
    """transformers' early exit shortens config.num_hidden_layers for a while; the lean forward follows it."""
    model = _model(kv_heads=2, num_hidden_layers=3)
    lean_target, plain = _targets(model)
    model.config.num_hidden_layers = 1
    try:
        _passes(lean_target, plain)
    finally:
        model.config.num_hidden_layers = 3
    assert lean_calls == [9, 5, 6, 1, 1]  # the lean forward ran the shortened model, not the model's forward


def test_a_hook_added_later_sends_passes_through_the_model(lean_calls):
    model = _model(kv_heads=2)
    target = Target(model)
    assert target.lean.ready()
    calls = []
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *args: calls.append(1))
    try:
        assert not target.lean.ready()
        _passes(target, Target(model, fast=False))
        assert calls and not lean_calls  # the hook ran: the passes went through the model's forward
    finally:
        handle.remove()
    assert target.lean.ready()  # transformers' own output-capturing hooks, installed by that pass, do not count


@pytest.mark.parametrize("change", ["train", "eager", "forward"])
def test_the_lean_forward_declines_while_the_model_changed(change):
    model = _model(kv_heads=2)
    target = Target(model)
    undo = {
        "train": lambda: (model.train(), model.eval),
        "eager": lambda: (setattr(model.config, "_attn_implementation", "eager"),
                          lambda: setattr(model.config, "_attn_implementation", "sdpa")),
        "forward": lambda: (setattr(model.lm_head, "forward", model.lm_head.forward),
                            lambda: delattr(model.lm_head, "forward")),
    }[change]()[1]
    assert not target.lean.ready()
    undo()
    assert target.lean.ready()


@pytest.mark.parametrize("kind", ["skinny", "stream"])
def test_packed_queries_equal_the_grouped_branch_bit_for_bit(kind, monkeypatch):
    """A verify pass with its query heads packed onto the key heads gives the logits and cache entries of sdpa's
    grouped indexing (the branch before packing), over a chain, a tree whose commit rewrites the cache, and decodes."""
    from specfamily.runtime import kernel, lean

    if kind == "stream" and not kernel.stream_kernel().available:
        pytest.skip(f"stream kernel unavailable: {kernel.stream_kernel().reason}")
    model = _model(kv_heads=2)
    # sdpa's branches (the attention kernel, on by default with the stream kernel, takes no sdpa branch)
    packed, grouped = (Target(model, matmul=kind, native_attention=False) for _ in range(2))
    original, taken = lean.plan_attention, []

    def plan(*args, **options):
        attend = original(*args, **{**options, "pack_queries": options.get("pack_queries") and not grouped_now})
        taken.append((grouped_now, attend.pack, attend.gqa, args[1]))
        return attend

    monkeypatch.setattr(lean, "plan_attention", plan)
    grouped_now = False
    gen = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=gen)  # noqa: E731
    steps = [(ids(9), None, []), (ids(1), Draft.chain(ids(4)), [0, 1]),
             (ids(1), Draft(ids(5), torch.tensor([-1, -1, 0, 1, 3])), [1, 3, 4]), (ids(1), None, [])]
    for pending, draft, accepted in steps:
        grouped_now = False
        a = packed.forward(pending, draft)
        grouped_now = True
        b = grouped.forward(pending, draft)
        assert torch.equal(a.logits, b.logits)
        packed.commit(accepted)
        grouped.commit(accepted)
        _assert_same_cache(packed, grouped)
    multi = [t for t in taken if t[3] > 1 and t[0] is False]
    assert multi and all(pack and not gqa for _, pack, gqa, _ in multi[1:])  # after the prefill: packed
    assert all(gqa and not pack for g, pack, gqa, q in taken if g and q > 1)
