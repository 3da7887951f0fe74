"""The streaming few-row kernel (specfamily.runtime.kernel): built once per session, equal to F.linear up to float32
rounding on every instruction set this CPU runs, its fallback when it cannot build, and stream targets' greedy text.

Where the kernel cannot build (no compiler or ninja) its tests skip, naming why, and the fallback tests still run;
``SPECFAMILY_REQUIRE_KERNEL=1`` turns that skip into a failure (for CI machines that must build it).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import specfamily as sf
from specfamily.runtime import kernel, matmul
from specfamily.runtime.kernel import DISABLE_ENV, KernelUnavailable, StreamKernel

# (out, in): output sizes off the 16-row panel (a padded last panel), odd input sizes, one panel exactly, many panels
SHAPES = [(50, 96), (37, 33), (5, 7), (130, 576), (3, 1), (16, 1536), (200, 40)]
VOCAB = 64


def _close(out: torch.Tensor, ref: torch.Tensor, width: int) -> None:
    """Equal up to float32 rounding of a sum of ``width`` products of unit-scale numbers."""
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * max(width, 1) ** 0.5)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_row_count_equals_f_linear(module, isa, shape):
    if isa not in module.supported_isas():
        pytest.skip(f"this CPU does not run {isa}")
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(out_features * 1000 + in_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen)
    for rows in (*range(1, 18), 31, 32, 33, 64, 65, 130):  # blocks of 16 rows, for any number of rows
        x = torch.randn(rows, in_features, generator=gen)
        for b in (None, bias):
            out = module.linear_with(x, weight, b, isa)
            assert out.shape == (rows, out_features) and out.is_contiguous()
            _close(out, F.linear(x, weight, b), in_features)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_linear_many_is_linear_on_each_weight_bit_for_bit(module, isa):
    """One parallel region over every weight's panels: each output has linear's bits, whatever the row count, the
    thread count, a weight's place among the others, a partial last panel, a bias or none."""
    if isa not in module.supported_isas():
        pytest.skip(f"this CPU does not run {isa}")
    gen = torch.Generator().manual_seed(7)
    weights = [torch.randn(n, 96, generator=gen) for n in (144, 48, 48, 50, 3)]
    biases = [None, torch.randn(48, generator=gen), None, torch.randn(50, generator=gen), None]
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for rows in (1, 2, 5, 9, 16, 17, 33):
                x = torch.randn(1, rows, 96, generator=gen)
                many = module.linear_many_with(x, weights, biases, isa)
                assert len(many) == len(weights)
                for w, b, out in zip(weights, biases, many, strict=True):
                    assert out.shape == (1, rows, w.shape[0])
                    assert torch.equal(out, module.linear_with(x, w, b, isa))
    finally:
        torch.set_num_threads(threads)


def test_linear_many_names_its_bad_inputs_and_leaves_gradients_to_f_linear(module):
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="stream_linear.linear_many: 2 weights need as many biases"):
        module.linear_many(x, [torch.randn(4, 8), torch.randn(4, 8)], [None])
    with pytest.raises(RuntimeError, match="x's last dimension must be the weight's 9 input features"):
        module.linear_many(x, [torch.randn(4, 8), torch.randn(4, 9)], [None, None])
    weight, other = torch.randn(4, 8, requires_grad=True), torch.randn(5, 8)
    out = module.linear_many(x, [weight, other], [None, None])  # one weight needs gradients: each product linear's
    assert out[0].requires_grad and torch.equal(out[0], F.linear(x, weight))
    assert torch.equal(out[1], module.linear(x, other))


def test_the_packed_layout_is_panels_of_16_output_rows(module):
    weight = torch.randn(37, 5)
    packed = module.pack(weight)
    assert module.PANEL == 16 and packed.shape == (3, 5, 16) and packed.is_contiguous()
    for row in range(48):
        expected = weight[row] if row < 37 else torch.zeros(5)  # the last panel zero-padded
        assert torch.equal(packed[row // 16, :, row % 16], expected)


def test_the_packed_copy_is_kept_on_the_weight_and_follows_its_writes(module):
    gen = torch.Generator().manual_seed(2)
    layer = torch.nn.Linear(24, 40)
    x = torch.randn(3, 24, generator=gen)
    with torch.no_grad():
        first = module.linear(x, layer.weight, layer.bias)
        packed = kernel._packed(layer.weight)
        assert packed is not None and kernel.packed_bytes([layer.weight, layer.weight]) == 3 * 24 * 16 * 4
        module.linear(x, layer.weight, layer.bias)
        assert kernel._packed(layer.weight) is packed  # reused, not remade
        assert kernel.PACKED_ATTR == module.PACKED_ATTR and kernel.PACKED_ATTR not in str(layer.state_dict())
        layer.weight.mul_(-2.0)  # written in place: the version counter moves, the copy is remade
        _close(module.linear(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias), 24)
        assert not torch.allclose(module.linear(x, layer.weight, layer.bias), first)
        layer.weight.data = torch.randn(40, 24, generator=gen)  # new storage
        _close(module.linear(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias), 24)
    kernel.drop_packed([layer.weight])
    assert kernel._packed(layer.weight) is None and kernel.packed_bytes([layer.weight]) == 0


def test_inference_tensors_and_transposed_weights(module):
    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        weight, x = torch.randn(33, 20, generator=gen), torch.randn(5, 20, generator=gen)
        _close(module.linear(x, weight), F.linear(x, weight), 20)
        weight.add_(1.0)  # an inference tensor counts no versions: never cached, so the write is seen
        _close(module.linear(x, weight), F.linear(x, weight), 20)
        assert kernel._packed(weight) is None
    transposed = torch.randn(20, 33, generator=gen).t()  # (33, 20), not contiguous: packed all the same
    _close(module.linear(x, transposed), F.linear(x, transposed), 20)


def test_non_contiguous_3d_and_1d_inputs(module):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(40, 24, generator=gen), torch.randn(40, generator=gen)
    transposed = torch.randn(24, 5, generator=gen).t()  # (5, 24), not contiguous
    assert not transposed.is_contiguous()
    _close(module.linear(transposed, weight, bias), F.linear(transposed, weight, bias), 24)
    batch = torch.randn(2, 3, 24, generator=gen)
    out = module.linear(batch, weight)
    assert out.shape == (2, 3, 40)
    _close(out, F.linear(batch, weight), 24)
    row = torch.randn(24, generator=gen)
    assert module.linear(row, weight, bias).shape == (40,)
    _close(module.linear(row, weight, bias), F.linear(row, weight, bias), 24)
    assert module.linear(torch.empty(0, 24), weight).shape == (0, 40)


def test_the_python_entry_points_reach_the_kernel(module):
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(3, 16, generator=gen), torch.randn(8, 16, generator=gen)
    assert matmul.linear_for("stream") is module.linear
    _close(matmul.stream_linear(x, weight), F.linear(x, weight), 16)
    assert kernel.stream_kernel().isa == module.supported_isas()[0]


def test_bad_inputs_are_named(module):
    weight = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="float32 tensors on the CPU, got BFloat16"):
        module.linear(torch.randn(2, 16, dtype=torch.bfloat16), weight.bfloat16())
    with pytest.raises(RuntimeError, match="weight's 16 input features, got x of shape \\[2, 15\\]"):
        module.linear(torch.randn(2, 15), weight)
    with pytest.raises(RuntimeError, match="bias must be float32 on the CPU with 8 elements"):
        module.linear(torch.randn(2, 16), weight, torch.randn(7))
    with pytest.raises(RuntimeError, match="stream_linear: weight must be a tensor, got list"):
        module.linear(torch.randn(2, 16), [[1.0] * 16] * 8)
    with pytest.raises(RuntimeError, match="instruction set 'sse9' is not supported"):
        module.linear_with(torch.randn(2, 16), weight, None, "sse9")


def test_autograd_inputs_go_to_f_linear(module):
    weight = torch.randn(8, 16, requires_grad=True)
    out = module.linear(torch.randn(2, 16), weight)
    assert out.requires_grad  # at::linear's result, with its graph


def _model(seed: int = 3) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    return model.eval()


def test_stream_greedy_text_matches_transformers_generate(module):
    model = _model()
    prompt = torch.tensor([5, 9, 17, 33, 2, 40])
    target = sf.load_target(model, matmul="stream")
    assert target.matmul == "stream" and target.lean is not None
    ours = sf.generate(target, None, prompt, max_new_tokens=24, sampling=sf.SamplingConfig(temperature=0.0)).tokens
    theirs = model.generate(prompt[None], max_new_tokens=24, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt[None]))[0, prompt.numel():]
    assert list(ours) == theirs.tolist()


@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 7, 64), (3, 5, 33)])
def test_the_one_call_rms_norm_equals_the_families_rms_norm(module, shape):
    from specfamily.runtime.lean import rms_norm

    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen) * 3
    weight = torch.randn(shape[-1], generator=gen)
    torch.testing.assert_close(module.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5), rtol=2e-6, atol=2e-6)
    wide = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen)[..., ::2]  # not contiguous
    torch.testing.assert_close(module.rms_norm(wide, weight, 1e-6), rms_norm(wide, weight, 1e-6), rtol=2e-6,
                               atol=2e-6)
    double = x.double()  # not float32: the op-for-op path, exactly
    assert torch.equal(module.rms_norm(double, weight.double(), 1e-5), rms_norm(double, weight.double(), 1e-5))


def test_the_lean_forward_norms_with_the_kernel_only_on_the_stream_kind(module):
    stream = sf.load_target(_model(), matmul="stream")
    exact = sf.load_target(_model(), matmul="exact")
    assert {layer.norm for layer in stream.lean._layers} == {module.rms_norm}
    assert stream.lean._norm_fn is module.rms_norm
    assert exact.lean._layers[0].norm is not module.rms_norm and exact.lean._norm_fn is not module.rms_norm


def test_eagle_on_a_stream_target_keeps_its_greedy_text(module):
    target = sf.load_target(_model(), matmul="stream")
    drafter = sf.create_drafter("eagle", target, weights="random", mode="tree", gamma=3)
    assert drafter.linear is module.linear
    greedy = sf.SamplingConfig(temperature=0.0)
    prompt = torch.tensor([5, 9, 17, 33, 2, 40, 5, 9])
    plain = sf.generate(target, None, prompt, max_new_tokens=16, sampling=greedy)
    result = sf.generate(target, drafter, prompt, max_new_tokens=16, sampling=greedy)
    assert list(result.tokens) == list(plain.tokens) and result.metrics.draft_steps > 0


@pytest.fixture
def unbuilt(monkeypatch):
    """A session where the kernel cannot build: no compiler (the real build stays memoised for later tests)."""

    def fail(verbose: bool = False):
        raise KernelUnavailable("no C++ compiler ('c++' is not on PATH)")

    monkeypatch.setattr(kernel, "build_kernel", fail)
    kernel.stream_kernel.cache_clear()
    yield
    kernel.stream_kernel.cache_clear()


def test_a_failed_build_warns_once_naming_why(unbuilt, caplog):
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.kernel"):
        first, second = kernel.stream_kernel(), kernel.stream_kernel()
    assert first is second and not first.available and first.isa is None
    assert first.reason == "KernelUnavailable: no C++ compiler ('c++' is not on PATH)"
    assert [r.getMessage() for r in caplog.records] == [
        "matmul 'stream' unavailable (KernelUnavailable: no C++ compiler ('c++' is not on PATH)): "
        "using the 'exact' and 'skinny' kinds"]
    with pytest.raises(RuntimeError, match="stream matmul kernel is not available here: KernelUnavailable"):
        matmul.linear_for("stream")


def test_stream_falls_back_to_auto_over_the_other_kinds(unbuilt, monkeypatch):
    timed = []
    monkeypatch.setattr(matmul, "kind_seconds", lambda weights, kinds: timed.append(sorted(kinds)) or
                        {"exact": 1.0, "skinny": 0.5})
    choice = matmul.choose_matmul("stream", _model())
    assert (choice.kind, choice.asked) == ("skinny", "stream") and timed == [["exact", "skinny"]]
    assert choice.note == ("stream kernel unavailable: KernelUnavailable: no C++ compiler ('c++' is not on PATH) "
                           "(skinny: not batch-invariant)")
    assert sf.load_target(_model(), matmul="stream").matmul == "skinny"
    assert matmul.choose_matmul("auto", _model()).seconds == {"exact": 1.0, "skinny": 0.5}


def test_the_disable_switch_and_a_missing_compiler_are_reasons(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    kernel.stream_kernel.cache_clear()
    try:
        assert kernel.stream_kernel() == StreamKernel(None, f"KernelUnavailable: {DISABLE_ENV} is set")
    finally:
        kernel.stream_kernel.cache_clear()
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(KernelUnavailable, match="no C\\+\\+ compiler \\('no-such-compiler-here' is not on PATH\\)"):
        kernel._check_tools()


def test_the_source_ships_with_the_package_and_builds_in_a_keyed_folder(tmp_path, monkeypatch):
    source = kernel.kernel_source()
    assert source.is_file() and source.suffix == ".cpp"
    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    folder = kernel.build_folder(source)
    assert folder.parent == tmp_path / "kernels" and folder.name.startswith("stream_linear-")


STREAM_DRAFTERS = {"prompt_lookup gamma=4": {"gamma": 4}, "eagle chain gamma=3": {"mode": "chain", "gamma": 3},
                   "eagle tree gamma=4": {"gamma": 4}, "small_model gamma=2": {"gamma": 2},
                   "eagle3 tree gamma=4": {"gamma": 4}, "eagle3 chain gamma=3": {"mode": "chain", "gamma": 3}}


@pytest.fixture(scope="module")
def smollm2_stream(module):
    """zoo:smollm2 on the stream kernel, its Spec-Bench first turns, and transformers' greedy continuations."""
    from eval_helpers import greedy_reference, spec_bench_first_turns

    threads = torch.get_num_threads()
    target = sf.load_target("zoo:smollm2", matmul="stream")
    prompts = spec_bench_first_turns(target.tokenizer)
    reference = greedy_reference(target.model, prompts, 48)
    yield target, prompts, reference
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("label", [None, *STREAM_DRAFTERS])
def test_smollm2_on_the_stream_kernel_keeps_transformers_greedy_text(smollm2_stream, label):
    target, prompts, reference = smollm2_stream
    assert target.matmul == "stream" and target.lean is not None and target.lean.ready()
    drafter = None if label is None else sf.create_drafter(label.split()[0], target, **STREAM_DRAFTERS[label])
    proposed = 0
    for ids, expected in zip(prompts, reference, strict=True):
        result = sf.generate(target, drafter, ids, 48)
        assert result.tokens == expected, f"{label or 'plain'} differs on a {len(ids)}-token prompt"
        proposed += result.metrics.proposed_tokens
    assert label is None or proposed > 0  # the fixed-length arms really verified drafts on the kernel
