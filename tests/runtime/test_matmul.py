"""How the lean forwards multiply: skinny_linear against F.linear, choose_matmul's choice (auto's timing, its
hysteresis, its own generator, refusals outside CPU float32), and skinny targets. The stream kernel: test_kernel.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import specfamily as sf
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime import matmul
from specfamily.runtime.matmul import (
    SKINNY_MAX_ROWS,
    MatmulChoice,
    choose_matmul,
    linear_for,
    resolve_matmul,
    skinny_linear,
)

VOCAB = 64


def _model(dtype=torch.float32, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model.to(dtype).eval()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_is_f_linear_up_to_float_rounding(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 96, generator=gen)
    weight = torch.randn(200, 96, generator=gen)
    b = torch.randn(200, generator=gen) if bias else None
    out = skinny_linear(x, weight, b)
    assert out.shape == (1, rows, 200) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_skinny_linear_leaves_many_rows_and_empty_inputs_to_f_linear():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 16, generator=gen)
    many = torch.randn(SKINNY_MAX_ROWS + 1, 16, generator=gen)
    assert torch.equal(skinny_linear(many, weight), F.linear(many, weight))
    unbounded = skinny_linear(many, weight, max_rows=None)  # every row through (W @ x^T)^T
    assert torch.equal(unbounded, torch.mm(weight, many.t()).t())
    assert skinny_linear(torch.empty(0, 16), weight).shape == (0, 50)


def test_skinny_linear_leaves_other_dtypes_to_f_linear():
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(*shape, generator=gen).bfloat16() for shape in ((3, 16), (50, 16), (50,)))
    assert torch.equal(skinny_linear(x, weight, bias), F.linear(x, weight, bias))  # bias added before rounding


def test_linear_for_names_the_kinds():
    assert linear_for("exact") is F.linear and linear_for("skinny") is skinny_linear
    with pytest.raises(ValueError, match="matmul must be 'exact', 'skinny' or 'stream' once resolved, got 'auto'"):
        linear_for("auto")


def test_resolve_matmul_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match=r"matmul must be one of \('exact', 'skinny', 'stream', 'auto'\), got 'x'"):
        resolve_matmul("x", _model())


@pytest.mark.parametrize("kind", ["skinny", "stream"])
def test_fast_kinds_are_refused_outside_cpu_float32(kind):
    with pytest.raises(ValueError, match=f"matmul='{kind}' multiplies float32 weights on a CPU; this model has "
                                         "torch.bfloat16 weights on cpu"):
        choose_matmul(kind, _model(torch.bfloat16))


@pytest.mark.parametrize("seconds, chosen", [
    ({"exact": 1.0, "skinny": 0.5}, "skinny"),
    ({"exact": 1.0, "skinny": 0.9}, "exact"),  # within the margin: exact stays
    ({"exact": 1.0, "skinny": 0.7, "stream": 0.6}, "stream"),
    ({"exact": 1.0, "skinny": 0.55, "stream": 0.6}, "stream"),  # skinny not clearly faster than stream
    ({"exact": 1.0, "skinny": 0.4, "stream": 0.6}, "skinny"),
    ({"exact": 1.0, "skinny": 1.2, "stream": 0.9}, "stream"),  # stream needs only to be no slower than exact
    ({"exact": 1.0, "skinny": 1.2, "stream": 1.0}, "stream"),
    ({"exact": 1.0, "skinny": 1.2, "stream": 1.05}, "exact"),
    ({"exact": 1.0, "skinny": 0.9, "stream": 1.05}, "exact"),  # skinny within the margin, stream slower
])
def test_auto_moves_off_exact_only_by_a_clear_margin(monkeypatch, seconds, chosen):
    timed = []
    monkeypatch.setattr(matmul, "kind_seconds", lambda weights, kinds: timed.append(len(weights)) or seconds)
    choice = choose_matmul("auto", _model())
    assert choice == MatmulChoice(chosen, "auto", seconds)
    assert timed == [2 * 7 + 1]  # every linear of the 2 layers (q, k, v, o, gate, up, down) and the head
    target = Target(_model(), matmul="auto")  # keeps the timings for run.json
    assert target.matmul == chosen and target.matmul_choice.seconds == seconds


def test_auto_keeps_exact_where_it_does_not_time(monkeypatch):
    monkeypatch.setattr(matmul, "kind_seconds", lambda weights, kinds: pytest.fail("timed a model it should not"))
    assert resolve_matmul("auto", _model(torch.bfloat16)) == "exact"
    assert resolve_matmul("auto", None) == "exact" and resolve_matmul("skinny", None) == "exact"
    assert resolve_matmul("skinny", _model()) == "skinny" and resolve_matmul("exact", _model()) == "exact"


def test_kind_seconds_interleaves_the_kinds_and_rotates_who_goes_first():
    calls = []
    kinds = {name: (lambda x, w, name=name: calls.append((name, x.shape[0]))) for name in ("a", "b", "c")}
    seconds = matmul.kind_seconds([torch.zeros(4, 8)], kinds, rows=(1, 2), rounds=3)
    assert sorted(seconds) == ["a", "b", "c"] and all(s >= 0 for s in seconds.values())
    firsts = [calls[i][0] for i in range(0, len(calls), 2 * 3)]  # each round: 3 kinds x 2 row counts x 1 weight
    assert firsts == ["a", "b", "c", "a"] and len(calls) == 4 * 3 * 2


def test_auto_times_real_kinds_without_touching_the_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    choice = choose_matmul("auto", _model())
    assert torch.equal(torch.get_rng_state(), before)
    assert choice.kind in choice.seconds and {"exact", "skinny"} <= set(choice.seconds)
    assert all(s > 0 for s in choice.seconds.values())


def test_timed_weights_stop_at_the_byte_budget():
    model = _model()
    first = model.model.layers[0].self_attn.q_proj.weight
    assert matmul.timed_weights(model, budget=1) == [first]


def test_a_skinny_target_says_so_and_only_with_the_lean_forward():
    model = _model()
    assert Target(model).matmul == "exact"
    assert Target(model, matmul="skinny").matmul == "skinny"
    assert Target(model, fast=False, matmul="skinny").matmul == "exact"  # the model's forward multiplies exactly


def _passes(target: Target) -> list[torch.Tensor]:
    """Prefill, a chain of 3, a tree of 5, a decode step: every pass's logits."""
    gen = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=gen)  # noqa: E731
    target.reset()
    out = []
    for pending, draft in [(ids(9), None), (ids(1), Draft.chain(ids(3))),
                           (ids(1), Draft(ids(5), torch.tensor([-1, 0, 0, 1, -1]))), (ids(1), None)]:
        out.append(target.forward(pending, draft).logits)
        target.commit([0] if draft is not None else [])
    return out


def test_skinny_logits_are_the_models_up_to_float_rounding():
    calls = []
    model = _model()
    skinny = Target(model, matmul="skinny")
    original = skinny.lean._linear
    skinny.lean._linear = lambda *args: calls.append(args[0].shape[-2]) or original(*args)  # head rows per pass
    for fast, exact in zip(_passes(skinny), _passes(Target(model, fast=False)), strict=True):
        torch.testing.assert_close(fast, exact, rtol=1e-5, atol=1e-5)
    assert calls == [1, 4, 6, 1]  # the head saw every pass, one to six rows (the skinny path's range)


def test_skinny_greedy_text_matches_transformers_generate():
    model = _model(seed=3)
    prompt = torch.tensor([5, 9, 17, 33, 2, 40])
    skinny = Target(model, matmul="skinny")
    ours = sf.generate(skinny, None, prompt, max_new_tokens=24, sampling=sf.SamplingConfig(temperature=0.0)).tokens
    theirs = model.generate(prompt[None], max_new_tokens=24, do_sample=False, pad_token_id=0)[0, prompt.numel():]
    assert list(ours) == theirs.tolist()


@pytest.mark.parametrize("name, options", [
    ("eagle", {"weights": "random", "mode": "tree", "gamma": 3}),
    ("eagle", {"weights": "random", "mode": "chain", "gamma": 3}),
    ("eagle3", {"weights": "random", "mode": "tree", "gamma": 3}),
    ("eagle3", {"weights": "random", "mode": "chain", "gamma": 3}),
    ("medusa", {"weights": "random", "share_lm_head": True, "gamma": 3}),
    ("small_model", {"gamma": 3}),
])
def test_drafters_on_a_skinny_target_keep_its_greedy_text(monkeypatch, name, options):
    calls = []  # (weight, x.dim()) of every skinny multiplication
    original = matmul.skinny_linear

    def counting(x, weight, bias=None, max_rows=SKINNY_MAX_ROWS):
        calls.append((weight, x.dim()))
        return original(x, weight, bias, max_rows)

    monkeypatch.setattr(matmul, "skinny_linear", counting)  # what linear_for hands out from here on
    model = _model(seed=3)
    skinny = Target(model, matmul="skinny")
    if name == "small_model":
        options = {**options, "model": _model(seed=4)}
    drafter = sf.create_drafter(name, skinny, **options)
    greedy = sf.SamplingConfig(temperature=0.0)
    prompt = torch.tensor([5, 9, 17, 33, 2, 40, 5, 9])
    plain = sf.generate(skinny, None, prompt, max_new_tokens=24, sampling=greedy)
    result = sf.generate(skinny, drafter, prompt, max_new_tokens=24, sampling=greedy)
    assert list(result.tokens) == list(plain.tokens)
    assert result.metrics.draft_steps > 0  # it drafted
    if name == "small_model":
        assert drafter.runner.matmul == "skinny"  # the draft model multiplies as the target does
    if name == "eagle":  # its lean layer (fc) and its head's single rows (1-D) went through the skinny path
        assert any(w is drafter.model.fc.weight for w, _ in calls) and any(dim == 1 for _, dim in calls)
    if name == "eagle3":  # its lean layer's products and, in a chain, its own head's single rows
        assert any(w is drafter.model.midlayer.self_attn.q_proj.weight for w, _ in calls)
        head_rows = 2 if options["mode"] == "tree" else 1  # a tree depth's rows read the head once (head_product)
        assert any(w is drafter.model.lm_head.weight and dim == head_rows for w, dim in calls)
    if name == "medusa":  # the shared head over the stacked heads' (depth, H) rows
        assert any(dim == 2 for _, dim in calls)


@pytest.mark.parametrize("seconds, kept", [
    ({"exact": 1.0, "skinny": 0.9, "stream": 1.05}, False),  # exact chosen: the timing's packed copies are freed
    ({"exact": 1.0, "skinny": 0.9, "stream": 0.5}, True),  # stream chosen: they are what it multiplies next
])
def test_auto_frees_the_stream_kernels_packed_copies_unless_it_picks_stream(monkeypatch, seconds, kept):
    from specfamily.runtime import kernel

    if not kernel.stream_kernel().available:
        pytest.skip(f"stream kernel unavailable: {kernel.stream_kernel().reason}")

    def timed(weights, kinds):
        with torch.no_grad():
            for weight in weights:
                kinds["stream"](torch.ones(2, weight.shape[1]), weight)  # packs, as the real timing does
        return seconds

    monkeypatch.setattr(matmul, "kind_seconds", timed)
    model = _model()
    weights = matmul.timed_weights(model)
    choice = choose_matmul("auto", model)
    assert choice.kind == ("stream" if kept else "exact")
    assert (kernel.packed_bytes(weights) > 0) is kept
