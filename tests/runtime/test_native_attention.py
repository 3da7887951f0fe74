"""The batch-invariant attention kernel (``specfamily.runtime.attention``) and the lean forward attending with it.

What is bit-identical to what (``torch.equal``), with ``Target(..., matmul="stream", native_attention=True)``:
- a fed row's logits in a chain or a tree pass equal those of the plain decode pass that would have fed that token
  (tiny Llama and Qwen2 models with 16-wide heads (AVX-512 where it runs) and 8-wide heads (AVX2 where it runs), and
  zoo:smollm2; the scalar loop on the kernel's own tests);
- the C++ layer loop equals the Python loop, both attending with the kernel;
- greedy text with prompt lookup and an EAGLE tree equals plain decoding's on the code target.
The kernel itself is close to sdpa (not equal: another order of the same sums). A failed build warns once and the
passes attend with sdpa, bit-identical to ``native_attention=False``."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import specfamily as sf
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime import attention, kernel
from specfamily.runtime.attention import DISABLE_ENV, attention_build, kernel_visible
from specfamily.runtime.native_layers import native_build
from specfamily.testing.depth import DepthRecorder

VOCAB = 64
needs_kernel = pytest.mark.skipif(not attention_build().available or not native_build().available,
                                  reason=f"no attention kernel or native loop: {attention_build().reason}")


def _model(family: str = "llama", head_dim: int = 16, seed: int = 0):
    """9 query heads over 3 key/value heads (SmolLM2's grouping), 2 layers; Qwen2 has q/k/v biases. The MLP width is
    a multiple of 32 (as SmolLM2's 1536): ATen's SiLU runs a row's tail past one in scalar code, other bits."""
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    config = config_class(vocab_size=VOCAB, hidden_size=9 * head_dim, intermediate_size=192, num_hidden_layers=2,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=512,
                          tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = model_class(config)
    model.config._attn_implementation = "sdpa"
    return model.eval()


def _target(model, native_layers: bool = True, tokenizer=None) -> Target:
    target = Target(model, tokenizer, matmul="stream", native_layers=native_layers, native_attention=True)
    assert target.lean.attention is attention_build().module.attend
    assert (target.lean.native is not None) == native_layers
    return target


def _decode(target: Target, prompt: torch.Tensor, tokens: list[int]) -> list[torch.Tensor]:
    """Plain decoding over ``prompt`` then ``tokens``: the logits row of each pass after the prefill."""
    target.reset()
    target.forward(prompt)
    target.commit([])
    rows = []
    for token in tokens:
        rows.append(target.forward(torch.tensor([token])).logits[0])
        target.commit([])
    return rows


def _rows_equal_plain_passes(target: Target, prompt: torch.Tensor) -> None:
    """A chain's and a tree's fed rows against the plain passes along each of their paths."""
    root, chain = 7, [3, 9, 1, 4]
    target.reset()
    target.forward(prompt)
    target.commit([])
    fed = target.forward(torch.tensor([root]), Draft.chain(torch.tensor(chain))).logits  # (5, V)
    target.commit([])
    plain = _decode(target, prompt, [root, *chain])
    assert len(plain) == 5 and all(torch.equal(fed[i], plain[i]) for i in range(5))
    tokens, parents = [5, 8, 2, 6, 11], [-1, -1, 0, 1, 2]  # two branches: 5 -> 2 -> 11 and 8 -> 6
    target.reset()
    target.forward(prompt)
    target.commit([])
    tree = target.forward(torch.tensor([root]), Draft(torch.tensor(tokens), torch.tensor(parents))).logits
    target.commit([])
    for path in ([0, 2, 4], [1, 3]):
        plain = _decode(target, prompt, [root, *(tokens[i] for i in path)])
        assert torch.equal(tree[0], plain[0])
        assert all(torch.equal(tree[node + 1], plain[depth + 1]) for depth, node in enumerate(path))


@needs_kernel
@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_the_kernel_is_sdpa_up_to_rounding_and_batch_invariant(isa):
    module = attention_build().module
    if isa not in module.supported_isas():
        pytest.skip(f"{isa} does not run here")
    gen = torch.Generator().manual_seed(0)
    query, keys, values = (torch.randn(1, h, n, 64, generator=gen) for h, n in ((9, 5), (3, 300), (3, 300)))
    visible = torch.ones(5, 300, dtype=torch.bool)
    visible[:, 295:] = torch.ones(5, 5, dtype=torch.bool).tril()
    out = module.attend_with(query, keys, values, visible, 0.125, isa)  # (1, 5, 9 * 64)
    expected = F.scaled_dot_product_attention(query, keys, values, attn_mask=visible[None, None], scale=0.125,
                                              enable_gqa=True).transpose(1, 2).reshape(1, 5, -1)
    assert torch.allclose(out, expected, atol=1e-5, rtol=1e-5) and not torch.equal(out, torch.zeros_like(out))
    for r in range(5):  # each row alone over the keys it sees: the same bits
        alone = module.attend_with(query[:, :, r : r + 1], keys[:, :, : 296 + r], values[:, :, : 296 + r], None,
                                   0.125, isa)
        assert torch.equal(alone[0, 0], out[0, r])
    for seed in range(8):  # rows seeing scattered keys (tree nodes: ancestors apart in the buffer, other key blocks
        # and slots) get the bits of one row over the same keys gathered in order
        scattered = torch.rand(5, 300, generator=torch.Generator().manual_seed(seed)) < 0.3 + 0.1 * seed
        scattered[:, 0] = True
        out = module.attend_with(query, keys, values, scattered, 0.125, isa)
        for r in range(5):
            kept = scattered[r].nonzero()[:, 0]
            alone = module.attend_with(query[:, :, r : r + 1], keys[:, :, kept], values[:, :, kept], None, 0.125, isa)
            assert torch.equal(out[0, r], alone[0, 0])


@needs_kernel
@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("fed", [1, 3, 9])
def test_a_rows_bits_do_not_depend_on_its_slot_or_keys_no_row_sees(isa, fed):
    # 3 query heads a key/value head: 3, 9 and 27 query rows (AVX-512 scores them eight to a sweep: one, two and four
    # sweeps, the last partial); keys and values no fed row sees are NaN. Each row equals the row alone (slot 0).
    module = attention_build().module
    if isa not in module.supported_isas():
        pytest.skip(f"{isa} does not run here")
    gen = torch.Generator().manual_seed(fed)
    query, keys, values = (torch.randn(1, h, n, 64, generator=gen) for h, n in ((9, fed), (3, 101), (3, 101)))
    visible = torch.rand(fed, 101, generator=gen) < 0.6
    visible[:, 0] = True
    if fed > 1:
        visible[0] = True  # one row sees a prefix (every key), the others scattered keys
    unseen = ~visible.any(0)
    keys[:, :, unseen] = float("nan")
    values[:, :, unseen] = float("nan")
    out = module.attend_with(query, keys, values, visible, 0.125, isa)
    assert torch.isfinite(out).all() and (unseen.any() or fed > 1)
    for r in range(fed):
        kept = visible[r].nonzero()[:, 0]
        alone = module.attend_with(query[:, :, r : r + 1], keys[:, :, kept], values[:, :, kept], None, 0.125, isa)
        assert torch.equal(out[0, r], alone[0, 0])


@needs_kernel
@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_tree_nodes_that_skip_a_key_after_a_long_prefix_keep_their_bits(isa):
    # A tree node sees the whole cache, then skips fed keys (another branch's): AVX-512 forwards its scores into place
    # order only past the prefix it sees (found by halving); rows whose first skipped key lies inside, at and past a
    # 32-key block's edge, and deep in the cache, each against the row alone over the keys it sees.
    module = attention_build().module
    if isa not in module.supported_isas():
        pytest.skip(f"{isa} does not run here")
    gen = torch.Generator().manual_seed(7)
    prefixes = [1, 2, 31, 32, 33, 64, 250, 293]
    query, keys, values = (torch.randn(1, h, n, 64, generator=gen) for h, n in ((9, 8), (3, 300), (3, 300)))
    visible = torch.zeros(len(prefixes), 300, dtype=torch.bool)
    for r, m in enumerate(prefixes):
        visible[r, :m] = True  # keys 0 .. m - 1, key m skipped, then every other key up to a few past it
        visible[r, m + 1 : min(300, m + 7) : 2] = True
    out = module.attend_with(query, keys, values, visible, 0.125, isa)
    for r in range(len(prefixes)):
        kept = visible[r].nonzero()[:, 0]
        alone = module.attend_with(query[:, :, r : r + 1], keys[:, :, kept], values[:, :, kept], None, 0.125, isa)
        assert torch.equal(out[0, r], alone[0, 0]), prefixes[r]


@needs_kernel
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_threads_split_heads_and_fed_rows_without_changing_bits(threads):
    # units of (key/value head, fed row) split among threads: 3 heads x 5 rows in runs of 8 and 7 (two threads),
    # 5 each (three), 4 (four): a head's rows on two threads; every row's bits those of one thread
    module = attention_build().module
    gen = torch.Generator().manual_seed(1)
    query, keys, values = (torch.randn(1, h, n, 64, generator=gen) for h, n in ((9, 5), (3, 200), (3, 200)))
    visible = torch.ones(5, 200, dtype=torch.bool)
    visible[:, 195:] = torch.ones(5, 5, dtype=torch.bool).tril()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = module.attend(query, keys, values, visible, 0.125)
        torch.set_num_threads(threads)
        split = module.attend(query, keys, values, visible, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(split, one) and not torch.equal(one, torch.zeros_like(one))


@needs_kernel
def test_passes_under_autograd_attend_with_sdpa():
    """The kernel has no backward: a lean pass with gradients on plans sdpa (the Python loop; the native one declines
    gradients too), one in inference mode the kernel."""
    target = _target(_model(), native_layers=False)
    ids, positions = torch.tensor([[1, 2]]), torch.tensor([[0, 1]])
    mask = torch.zeros(1, 1, 2, 2)
    with torch.enable_grad():
        assert target.lean._prepare(ids, positions, mask, target.cache)[3].kernel is None
    with torch.inference_mode():
        assert target.lean._prepare(ids, positions, mask, target.cache)[3].kernel is target.lean.attention


def test_kernel_visible_takes_hidden_or_seen_masks_only():
    hidden = torch.finfo(torch.float32).min
    mask = torch.zeros(1, 1, 2, 6)
    mask[0, 0, 0, 5] = hidden
    taken, visible = kernel_visible(mask, 2)
    assert taken and visible.tolist() == [[True] * 5 + [False], [True] * 6]
    assert kernel_visible(None, 1) == (True, None)
    assert not kernel_visible(None, 3)[0]  # a causal prefill: sdpa
    assert not kernel_visible(mask.masked_fill(mask == 0, -1.5), 2)[0]  # a real additive bias: sdpa
    assert not kernel_visible(torch.zeros(2, 1, 2, 6), 2)[0]  # a batch
    assert not kernel_visible(torch.zeros(1, 1, 65, 70), 65)[0]  # past MAX_ROWS
    assert kernel_visible(mask == 0, 2)[1].tolist() == visible.tolist()  # boolean masks as they are


@needs_kernel
@pytest.mark.parametrize(("family", "head_dim"), [("llama", 16), ("qwen2", 16), ("llama", 8)])
@pytest.mark.parametrize("native_layers", [True, False], ids=["native-loop", "python-loop"])
def test_fed_rows_equal_the_plain_passes_that_would_feed_them(family, head_dim, native_layers):
    target = _target(_model(family, head_dim), native_layers)
    _rows_equal_plain_passes(target, torch.arange(20) % VOCAB)
    if native_layers:
        assert target.lean.native.calls > 0


@needs_kernel
@pytest.mark.parametrize("native_layers", [True, False], ids=["native-loop", "python-loop"])
def test_a_targets_drafted_pass_takes_its_layouts_visibility(native_layers, monkeypatch):
    """The target hands the lean forward its tree layout's visibility: the mask is not read back (``kernel_visible``
    is not called for a drafted pass), and the logits equal those of a pass that reads it back, bit for bit."""
    import specfamily.runtime.lean as lean_module
    from specfamily.core.tree_mask import TreeLayout

    target = _target(_model(), native_layers)
    prompt, draft = torch.arange(20) % VOCAB, Draft(torch.tensor([4, 5, 6, 7]), torch.tensor([-1, -1, 0, 1]))
    target.forward(prompt)
    target.commit([])
    with monkeypatch.context() as patch:  # no visibility from the layout: the lean forward reads the mask back
        patch.setattr(TreeLayout, "visible", lambda self, start: None)
        read_back = target.forward(torch.tensor([1]), draft).logits
    target.commit([])
    target.rollback(20)
    with monkeypatch.context() as patch:
        patch.setattr(lean_module, "kernel_visible", lambda mask, q: pytest.fail("the mask was read back"))
        hinted = target.forward(torch.tensor([1]), draft).logits
    assert torch.equal(hinted, read_back)
    target.commit([1, 3])
    if native_layers:
        assert target.lean.native.calls == 2


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_native_loop_equals_the_python_loop_with_the_kernel(family):
    model = _model(family)
    native, python = _target(model), _target(model, native_layers=False)
    prompt = torch.arange(30) % VOCAB
    for target in (native, python):
        target.forward(prompt)
        target.commit([])
    steps = [(torch.tensor([1]), Draft(torch.tensor([4, 5, 6, 7]), torch.tensor([-1, -1, 0, 1])), [1, 3]),
             (torch.tensor([2]), None, []), (torch.tensor([3]), Draft.chain(torch.tensor([8, 9, 10])), [0])]
    for pending, draft, accepted in steps:
        assert torch.equal(native.forward(pending, draft).logits, python.forward(pending, draft).logits)
        native.commit(accepted)
        python.commit(accepted)
    assert native.lean.native.calls == len(steps)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(native.cache.layers, python.cache.layers, strict=True))


@needs_kernel
@pytest.mark.parametrize("drafter", ["prompt_lookup", "eagle"])
def test_greedy_text_on_the_code_target_is_plain_decodings(drafter):
    loaded = sf.load_target("zoo:code-target", device="cpu", matmul="stream")
    target = _target(loaded.model, tokenizer=loaded.tokenizer)
    prompt = loaded.tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n    ")["input_ids"]
    plain = sf.generate(target, None, prompt, max_new_tokens=32).tokens
    options = {"gamma": 4} if drafter == "prompt_lookup" else {"gamma": 3}
    recorder = DepthRecorder(sf.create_drafter(drafter, target, **options), gamma=options["gamma"])
    assert sf.generate(target, recorder, prompt, max_new_tokens=32).tokens == plain
    assert recorder.stats.passes > 0 and recorder.stats.deepest_accepted >= 1, recorder.stats.summary()
    if drafter == "eagle":
        assert recorder.stats.trees > 0, recorder.stats.summary()


@pytest.mark.slow
@needs_kernel
def test_smollm2_fed_rows_equal_plain_passes_in_both_loops():
    loaded = sf.load_target("zoo:smollm2", matmul="stream")
    prompt = torch.arange(100, 160)
    for native_layers in (True, False):
        target = _target(loaded.model, native_layers)
        assert target.lean._layers[0].head_dim == 64  # the AVX-512 path where it runs
        _rows_equal_plain_passes(target, prompt)


@pytest.fixture
def unbuilt(monkeypatch):
    """A session where the attention kernel cannot build (the real build stays memoised for later tests)."""
    def fail(*args, **kwargs):
        raise RuntimeError("Error building extension 'specfamily_attention'\nmore lines")

    monkeypatch.setattr(kernel, "build_extension", fail)  # what kernel.build_source calls
    attention.build_attention.cache_clear()
    attention_build.cache_clear()
    yield
    attention.build_attention.cache_clear()
    attention_build.cache_clear()


def test_a_failed_build_warns_once_and_attends_with_sdpa(unbuilt, caplog):
    model = _model()
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.attention"):
        first = Target(model, matmul="stream", native_attention=True)
        Target(model, matmul="stream", native_attention=True)
    plain = Target(model, matmul="stream")
    assert first.lean.attention is None and plain.lean.attention is None
    assert [r.getMessage() for r in caplog.records] == [
        "attention kernel unavailable (RuntimeError: Error building extension 'specfamily_attention'): passes "
        "attend with sdpa"]
    for target in (first, plain):
        target.forward(torch.arange(12))
        target.commit([])
    draft = Draft.chain(torch.tensor([1, 2, 3]))
    assert torch.equal(first.forward(torch.tensor([5]), draft).logits, plain.forward(torch.tensor([5]), draft).logits)


def test_the_disable_switch_is_a_reason(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    attention_build.cache_clear()
    try:
        assert attention_build().reason == f"KernelUnavailable: {DISABLE_ENV} is set"
        assert Target(_model(), matmul="stream", native_attention=True).lean.attention is None
    finally:
        attention_build.cache_clear()


def test_other_matmul_kinds_attend_with_sdpa():
    model = _model()
    assert Target(model, matmul="exact", native_attention=True).lean.attention is None
    assert Target(model, matmul="stream", native_attention=False).lean.attention is None
    with pytest.raises(ValueError, match="native_attention must be True, False or 'auto', got 'yes'"):
        Target(model, matmul="stream", native_attention="yes")


@needs_kernel
def test_auto_takes_the_kernel_where_it_runs_vectorised():
    """The default: the kernel where its AVX-512 loops run (the measured case), sdpa where it would run its scalar
    loop or AVX2's (8-wide heads here; any head width on a CPU without AVX-512)."""
    wide, narrow = Target(_model(head_dim=16), matmul="stream"), Target(_model(head_dim=8), matmul="stream")
    avx512 = attention_build().module.isa() == "avx512"
    assert (wide.lean.attention is not None) == avx512 and narrow.lean.attention is None
    assert Target(_model(head_dim=8), matmul="stream", native_attention=True).lean.attention is not None
