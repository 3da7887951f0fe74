"""The lean forward's layer loop in C++ (``specfamily.runtime.native_layers``): bit-identical to the Python loop
(logits and every cache entry, ``torch.equal``) on tiny grouped-query Llama and Qwen2 models and on zoo:smollm2 over
a prefill, decode steps, chains and a tree whose commit moves cache entries; greedy text identical to plain decoding
with prompt lookup and an EAGLE tree; the passes it does not cover keep the Python loop; a failed build warns once
and runs the Python loop.

Where the stream kernel cannot build, the tests that need it skip (the fallback tests still run)."""

from __future__ import annotations

import copy
import logging
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import specfamily as sf
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime import native_layers
from specfamily.runtime.kernel import KernelUnavailable, stream_kernel
from specfamily.runtime.lean import rotate_pair
from specfamily.runtime.native_layers import DISABLE_ENV, NativeLayers, native_build
from specfamily.testing.depth import DepthRecorder

VOCAB = 64
needs_native = pytest.mark.skipif(not native_build().available, reason=f"no native layers: {native_build().reason}")


def _model(family: str = "llama", seed: int = 0):
    """9 query heads over 3 key/value heads (SmolLM2's grouping), head width 8, 2 layers; Qwen2 has q/k/v biases."""
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    config = config_class(vocab_size=VOCAB, hidden_size=72, intermediate_size=144, num_hidden_layers=2,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=512,
                          tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = model_class(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.5)  # random biases, not transformers' zeros: the products really add them
    model.config._attn_implementation = "sdpa"
    return model.eval()


def _pair(model) -> tuple[Target, Target]:
    """The same model with the layer loop in C++ and in Python."""
    native = Target(model, matmul="stream", native_layers=True)
    python = Target(model, matmul="stream", native_layers=False)
    assert isinstance(native.lean.native, NativeLayers) and python.lean.native is None
    return native, python


def _steps(vocab: int = VOCAB, prompt: int = 11):
    """A prefill, a tree whose commit moves entries, a chain half kept, decode steps, a chain kept whole."""
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=gen)  # noqa: E731
    return [(ids(prompt), None, []), (ids(1), Draft(ids(4), torch.tensor([-1, -1, 0, 1])), [1, 3]),
            (ids(1), Draft.chain(ids(4)), [0, 1]), (ids(1), None, []), (ids(1), None, []),
            (ids(1), Draft.chain(ids(5)), [0, 1, 2, 3, 4]), (ids(1), None, [])]


def _passes(target: Target, steps) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each pass's logits, and every layer's kept keys and values after the last commit."""
    logits = []
    for pending, draft, accepted in steps:
        logits.append(target.forward(pending, draft).logits)
        target.commit(accepted)
    return logits, [t.clone() for layer in target.cache.layers for t in (layer.keys, layer.values)]


def _assert_identical(native: Target, python: Target, steps) -> None:
    ours, theirs = _passes(native, steps), _passes(python, steps)
    assert len(ours[0]) == len(theirs[0]) == len(steps)
    assert all(torch.equal(a, b) for a, b in zip(ours[0], theirs[0], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1], strict=True))
    assert native.cached_length == python.cached_length == ours[1][0].shape[2]


@needs_native
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_native_loop_is_bit_identical_to_the_python_loop(family):
    native, python = _pair(_model(family))
    steps = _steps()
    _assert_identical(native, python, steps)
    assert native.lean.native.calls == len(steps) - 1  # every pass over a non-empty cache; the prefill in Python
    assert native.lean.native.fused_layers == 2 * native.lean.native.calls  # the rope and cache writes' one loop
    plain_rows = [s for s in steps if s[1] is None][1:]
    assert plain_rows and all(d is not None for _, d, _ in steps[1:3])  # decode, tree and chain passes were native


@needs_native
def test_the_native_loop_writes_into_grown_buffers_as_the_python_loop():
    native, python = _pair(_model())
    steps = _steps(prompt=60) + [(torch.tensor([i % VOCAB]), None, []) for i in range(20)]  # past 60 + 64 entries
    _assert_identical(native, python, steps)
    buffer = native.cache.layers[0]._buffers[0]
    assert buffer.shape[2] > 60 + 64 // 2 and native.lean.native.calls == len(steps) - 1


@needs_native
def test_sdpas_grouped_indexing_is_bit_identical_too():
    """Verify passes unpacked (``pack_queries=False``: sdpa's enable_gqa under the mask), as --grouped runs."""
    native, python = _pair(_model())
    native.lean.pack_queries = python.lean.pack_queries = False
    _assert_identical(native, python, _steps())
    assert native.lean.native.calls == len(_steps()) - 1


@needs_native
def test_repeated_keys_and_values_are_bit_identical_too():
    """transformers' repeat_kv branch (grouped heads, neither enable_gqa nor packing), which no stream pass plans."""
    native, python = _pair(_model())
    for target in (native, python):
        target.forward(torch.arange(9))
        target.commit([])
    with torch.inference_mode():
        ids, positions = torch.tensor([[4]]), torch.tensor([[9]])
        hidden, cos, sin, attend = native.lean._prepare(ids, positions, None, native.cache)
        attend = replace(attend, gqa=False, pack=False)
        ours, _ = native.lean.native(hidden, cos, sin, attend, native.cache)
        theirs = hidden
        for layer in python.lean._layers:
            theirs = layer(theirs, cos, sin, attend, python.cache)
    assert native.lean.native.calls == 1 and attend.groups == 3 and torch.equal(ours, theirs)
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(native.cache.layers, python.cache.layers, strict=True))


@needs_native
def test_the_rope_by_atens_ops_gives_the_same_bits():
    """cos and sin not contiguous: the rope and cache writes run as ATen's ops, not the fused loop."""
    native, python = _pair(_model())
    for target in (native, python):
        target.forward(torch.arange(9))
        target.commit([])
    strided = lambda t: torch.stack((t, t), -1)[..., 0]  # noqa: E731 - the same values, every other float
    with torch.inference_mode():
        ids, positions = torch.tensor([[4]]), torch.tensor([[9]])
        hidden, cos, sin, attend = native.lean._prepare(ids, positions, None, native.cache)
        assert not strided(cos).is_contiguous()
        ours, _ = native.lean.native(hidden, strided(cos), strided(sin), attend, native.cache)
        theirs = hidden
        for layer in python.lean._layers:
            theirs = layer(theirs, cos, sin, attend, python.cache)
    assert native.lean.native.calls == 1 and native.lean.native.fused_layers == 0
    assert torch.equal(ours, theirs)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(native.cache.layers, python.cache.layers, strict=True))


@needs_native
@pytest.mark.parametrize("features", [(0, 1), (2, 0), (2,), (1, 1)], ids=["layer-inputs", "unordered-with-final",
                                                                          "final-only", "repeated"])
def test_layer_features_come_back_from_the_native_loop_bit_for_bit(features):
    """EAGLE-3's layer features (transformers' hidden_states indexing: i < L a layer's input, L after the final
    norm) from a native pass equal the Python loop's, in the order asked, with the cache written alike."""
    native, python = _pair(_model())
    for target in (native, python):
        target.forward(torch.arange(9))
        target.commit([])
    ours = native.forward(torch.tensor([3, 5]), features=features)
    theirs = python.forward(torch.tensor([3, 5]), features=features)
    assert native.lean.native.calls == 1 and python.lean.native is None
    assert ours.features.shape == (2, len(features) * 72)  # two fed rows; hidden_size 72 (``_model``)
    assert torch.equal(ours.features, theirs.features) and torch.equal(ours.logits, theirs.logits)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(native.cache.layers, python.cache.layers, strict=True))


@needs_native
def test_out_of_scope_passes_keep_the_python_loop():
    model = _model()
    native, python = _pair(model)
    for target in (native, python):
        target.forward(torch.arange(9))
        target.commit([])
    assert native.lean.native.calls == 0  # a prefill over an empty cache
    native.lean.rotate = python.lean.rotate = lambda *args: rotate_pair(*args)  # a compiled rope stands in
    assert torch.equal(native.forward(torch.tensor([4])).logits, python.forward(torch.tensor([4])).logits)
    assert native.lean.native.calls == 0
    native.lean.rotate = None
    native.commit([])
    with torch.inference_mode():  # self-speculation's draft: some sub-layers skipped
        ids, positions = torch.tensor([[5]]), torch.tensor([[native.cached_length]])
        skipped = native.lean.skipping(ids, positions, None, native.cache, [(True, False), (False, True)])
    assert skipped.shape == (1, 1, 72) and native.lean.native.calls == 0
    assert Target(model, matmul="exact").lean.native is None  # other matmul kinds
    assert Target(model, matmul="skinny").lean.native is None


@needs_native
def test_a_failing_native_pass_warns_once_and_reruns_in_python(caplog):
    native, python = _pair(_model())
    steps = _steps()
    _passes(native, steps[:2])  # a prefill and a native tree pass

    class Broken:
        calls = fused_layers = 0

        def forward(self, *args):
            raise RuntimeError("native_layers: broken on purpose\nsecond line")

    native.lean.native._native = Broken()
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.native_layers"):
        ours = _passes(native, steps[2:])
    theirs = _passes(python, steps)
    assert all(torch.equal(a, b) for a, b in zip(ours[0], theirs[0][2:], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1], strict=True))
    assert native.lean.native.reason == "RuntimeError: native_layers: broken on purpose"
    assert [r.getMessage() for r in caplog.records] == [
        "the native layer loop failed, running the Python loop: RuntimeError: native_layers: broken on purpose"]


@pytest.fixture
def unbuilt(monkeypatch):
    """A session where the native layers cannot build (the real build stays memoised for later tests)."""

    def fail(verbose: bool = False):
        raise KernelUnavailable("no C++ compiler ('c++' is not on PATH)")

    monkeypatch.setattr(native_layers, "build_native", fail)
    native_build.cache_clear()
    yield
    native_build.cache_clear()


def test_a_failed_build_warns_once_and_runs_the_python_loop_bit_for_bit(unbuilt, caplog):
    if not stream_kernel().available:
        pytest.skip(f"no stream kernel: {stream_kernel().reason}")
    model = _model()
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.native_layers"):
        first, second = Target(model, matmul="stream"), Target(model, matmul="stream", native_layers=False)
        Target(model, matmul="stream")
    assert first.lean.native is None and second.lean.native is None
    assert [r.getMessage() for r in caplog.records] == [
        "native layer loop unavailable (KernelUnavailable: no C++ compiler ('c++' is not on PATH)): the lean forward "
        "runs its Python loop"]
    steps = _steps()
    ours, theirs = _passes(first, steps), _passes(second, steps)
    assert all(torch.equal(a, b) for a, b in zip(ours[0] + ours[1], theirs[0] + theirs[1], strict=True))


@needs_native
def test_a_stream_kernel_without_the_capsules_it_knows_is_declined(monkeypatch, caplog):
    monkeypatch.setattr(stream_kernel().module, "_products_capsule", object())
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.native_layers"):
        assert Target(_model(), matmul="stream").lean.native is None
    assert [r.getMessage() for r in caplog.records] == [
        "native layer loop unavailable (RuntimeError: native_layers: the stream kernel's _products_capsule is not a "
        "specfamily.stream_products.v1 capsule): the lean forward runs its Python loop"]


@needs_native
def test_the_loop_keeps_each_packed_copy_and_packs_anew_when_a_weight_changes_through_data():
    """While a weight is as it was, the loop's product reads the packed copy it recorded (the owner's attribute is
    not asked: deleted, it stays deleted); a write through ``.data`` (no version the weight counts) is seen by the
    sampled elements: the loop packs anew, and its logits stay the Python loop's on the changed weights."""
    model, steps = _model("qwen2"), _steps()
    native, python = _pair(model)
    _assert_identical(native, python, steps[:2])
    attr, weight = stream_kernel().module.PACKED_ATTR, model.model.layers[1].mlp.down_proj.weight
    delattr(weight, attr)
    ours = _passes(native, steps[2:3])
    assert not hasattr(weight, attr)  # the loop's own record served the product
    theirs = _passes(python, steps[2:3])  # the Python loop's products ask the attribute: packed again there
    assert hasattr(weight, attr)
    delattr(weight, attr)
    with torch.no_grad():
        weight.data.mul_(-1.5)
    ours2 = _passes(native, steps[3:5])
    assert hasattr(weight, attr)  # the changed samples sent the loop to pack anew (packed_for: kept on the owner)
    theirs2 = _passes(python, steps[3:5])
    for a, b in zip(ours[0] + ours2[0] + ours2[1], theirs[0] + theirs2[0] + theirs2[1], strict=True):
        assert torch.equal(a, b)


def test_the_disable_switch_is_a_reason(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    native_build.cache_clear()
    try:
        assert native_build().reason == f"KernelUnavailable: {DISABLE_ENV} is set" and not native_build().available
        assert Target(_model(), matmul="stream").lean.native is None
    finally:
        native_build.cache_clear()


def test_the_source_ships_with_the_package_and_builds_in_a_keyed_folder(tmp_path, monkeypatch):
    from specfamily.runtime.kernel import build_folder

    source = native_layers.native_source()
    assert source.is_file() and source.parent.name == "layers"
    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    folder = build_folder(source, [source], "native_layers")
    assert folder.parent == tmp_path / "kernels" and folder.name.startswith("native_layers-")


@needs_native
@pytest.mark.parametrize("drafter", ["prompt_lookup", "eagle"])
def test_greedy_text_on_the_code_target_is_plain_decodings(drafter):
    loaded = sf.load_target("zoo:code-target", device="cpu", matmul="stream")
    assert loaded.lean.native is not None
    python = Target(loaded.model, loaded.tokenizer, matmul="stream", native_layers=False)
    prompt = loaded.tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n    ")["input_ids"]
    plain = sf.generate(python, None, prompt, max_new_tokens=32).tokens
    options = {"gamma": 4} if drafter == "prompt_lookup" else {"gamma": 3}
    recorder = DepthRecorder(sf.create_drafter(drafter, loaded, **options), gamma=options["gamma"])
    calls = loaded.lean.native.calls
    assert sf.generate(loaded, recorder, prompt, max_new_tokens=32).tokens == plain
    assert loaded.lean.native.calls > calls and recorder.stats.passes > 0
    if drafter == "eagle":
        assert recorder.stats.trees > 0 and recorder.stats.deepest_accepted >= 1, recorder.stats.summary()


@pytest.mark.slow
@needs_native
def test_smollm2_native_loop_is_bit_identical():
    native = sf.load_target("zoo:smollm2", matmul="stream")
    python = Target(native.model, native.tokenizer, matmul="stream", native_layers=False)
    assert native.lean.native is not None and python.lean.native is None
    steps = _steps(vocab=native.vocab_size, prompt=40)
    _assert_identical(native, python, steps)
    assert native.lean.native.calls == len(steps) - 1
    assert native.lean.native.fused_layers == native.num_layers * native.lean.native.calls


@needs_native
def test_a_copy_shares_the_native_layers_only_with_the_weights():
    """Batch slots deep-copy a drafter with its own draft target (small_model), its modules shared: the copy runs the
    same native layers. A copy of the weights themselves runs the Python loop (the C++ object holds the originals)."""
    native, _ = _pair(_model())
    native.forward(torch.arange(9))
    native.commit([])
    memo = {id(module): module for module in native.model.modules()}
    memo.update({id(tensor): tensor for tensor in native.model.parameters()})
    shared = copy.deepcopy(native, memo)
    assert shared.lean.native is native.lean.native
    calls = native.lean.native.calls
    assert torch.equal(shared.forward(torch.tensor([4])).logits, native.forward(torch.tensor([4])).logits)
    assert native.lean.native.calls == calls + 2
    for target in (shared, native):
        target.commit([])
    full = copy.deepcopy(native)
    assert full.lean.native is None and full.model is not native.model
    assert torch.equal(full.forward(torch.tensor([5])).logits, native.forward(torch.tensor([5])).logits)


@needs_native
def test_a_pass_on_the_arena_takes_its_buffers_once_for_every_layer(monkeypatch):
    """On the shared arena a native pass reserves no layer one by one: it reads the arena's buffers, made once per
    arena tensor, and exposes every layer with one call; bit-identical to the Python loop, growth included."""
    native, python = _pair(_model())
    native.forward(torch.arange(60) % VOCAB)
    native.commit([])

    def refuse(*args):
        raise AssertionError("a layer reserved on its own")

    monkeypatch.setattr(native_layers.BufferedLayer, "reserve", refuse)
    arena = native.cache.layers[0].arena
    before = arena.buffers()
    steps = [(torch.tensor([i % VOCAB]), None, []) for i in range(3)]
    for pending, draft, accepted in steps:
        native.forward(pending, draft)
        native.commit(accepted)
    assert native.lean.native.calls == 3 and arena.buffers()[0] is before[0]  # made once, not per pass
    monkeypatch.undo()
    native, python = _pair(_model())
    _assert_identical(native, python, _steps(prompt=60) + [(torch.tensor([i % VOCAB]), None, []) for i in range(70)])


@needs_native
def test_arena_layers_of_different_lengths_are_reserved_one_by_one():
    native, python = _pair(_model())
    for target in (native, python):
        target.forward(torch.arange(11) % VOCAB)
        target.commit([])
        layer = target.cache.layers[1]
        layer.cut(layer.keys.shape[2] - 3)  # the second layer drops its last 3 entries, the first keeps them
    _assert_identical(native, python, [(torch.tensor([5]), None, []), (torch.tensor([7]), None, [])])
    assert native.lean.native.calls == 2
