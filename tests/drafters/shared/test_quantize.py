"""8-bit drafts (specfamily.drafters.shared.quantize): int8 copies of the draft's weights, exactness kept."""

import logging

import pytest
import torch
from torch import nn

import specfamily as sf
from specfamily.drafters.eagle.drafter import Eagle3Drafter, EagleDrafter
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.hydra_drafter import HydraDrafter
from specfamily.drafters.shared.quantize import Int8Linear, Int8Linears, check_bits, int8_linear, quantize_heads
from specfamily.drafters.small_model.drafter import SmallModelDrafter
from specfamily.runtime.int8_matmul import int8_kernel
from specfamily.testing import SAMPLING_MATRIX, assert_lossless, draft_model_for, tiny_target

PROMPT = [3, 1, 4, 1, 5]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def _float_linears(module: nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if type(m) is nn.Linear]


needs_kernel = pytest.mark.skipif(not int8_kernel().available, reason=f"int8 kernel not built: {int8_kernel().reason}")


@pytest.mark.parametrize("kernel", [pytest.param(True, marks=needs_kernel), False])
def test_int8_linear_is_close_to_float_and_holds_int8_weights(kernel):
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(5, 64, generator=gen)
    q = int8_linear(weight, bias, kernel=kernel)
    if kernel:
        assert q.kind == "kernel" and q.inner.packed.dtype == torch.int8
    else:
        assert q.kind == "torch.ao" and q.inner.weight().dtype == torch.qint8
    exact = nn.functional.linear(x, weight, bias)
    assert (q(x) - exact).abs().max() < 0.05 * exact.abs().max()
    assert not torch.equal(q(x), exact)  # it did run in int8
    assert q(x[0]).shape == (96,) and torch.allclose(q(x[0]), q(x[:1])[0], atol=1e-5)
    assert q(x.double()).dtype == torch.float64


@needs_kernel
def test_the_kernel_is_the_default_where_it_builds_and_multiplies_the_dequantized_weights():
    gen = torch.Generator().manual_seed(2)
    weight, x = torch.randn(33, 20, generator=gen), torch.randn(3, 20, generator=gen)
    q = int8_linear(weight)
    assert q.kind == "kernel"
    torch.testing.assert_close(q(x), nn.functional.linear(x, q.inner.weight()), rtol=1e-5, atol=1e-5)


def test_a_failed_kernel_build_falls_back_to_torch_ao_with_one_warning(int8_unbuilt, caplog):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.int8_matmul"):
        drafter = SmallModelDrafter(target, model=draft_model_for(target), gamma=3, quantize=8)
    kinds = {entry[1].kind for entry in drafter.runner.lean._linear._table.values()}
    assert kinds == {"torch.ao"} and len(caplog.records) == 1
    why = "int8 weight-only kernel unavailable (RuntimeError: Error building extension 'specfamily_int8_linear')"
    assert why in caplog.records[0].getMessage()
    with pytest.raises(RuntimeError, match="the int8 weight-only kernel is not available here: RuntimeError: Error"):
        int8_linear(torch.ones(2, 2), kernel=True)
    plain = sf.generate(target, None, PROMPT, max_new_tokens=24).tokens
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=24)
    assert result.tokens == plain and result.metrics.draft_steps > 0


@needs_kernel
def test_int8_lean_forward_norms_with_the_stream_kernel_where_the_weights_are_float32():
    from specfamily.runtime.kernel import stream_kernel
    from specfamily.runtime.matmul import stream_norm

    gen = torch.Generator().manual_seed(3)
    weights = [(torch.randn(24, 16, generator=gen), None), (torch.randn(16, 24, generator=gen), torch.zeros(16))]
    linear = Int8Linears(weights)
    assert linear.stream_norm is True and len(linear._direct) == len(linear) == 2
    x = torch.randn(2, 16, generator=gen)
    torch.testing.assert_close(linear(x, weights[0][0]), linear._table[weights[0][0].data_ptr()][1](x))
    if stream_kernel().available:
        assert stream_norm(linear) is stream_kernel().module.rms_norm
    assert Int8Linears([(torch.ones(4, 4, dtype=torch.float64), None)]).stream_norm is False


def _kinds(module: nn.Module) -> set[str]:
    return {m.kind for m in module.modules() if isinstance(m, Int8Linear)}


@needs_kernel
@pytest.mark.parametrize("name,options", [("small_model", {"model": "zoo:code-draft"}),
                                          ("medusa", {"weights": "zoo:code-medusa", "policy": "constant"}),
                                          ("eagle3", {"weights": "random", "mode": "chain", "policy": "constant"})])
def test_int8_drafts_on_the_code_target_run_the_kernel_and_keep_greedy_text(name, options):
    target = sf.load_target("zoo:code-target", device="cpu")
    drafter = sf.create_drafter(name, target, quantize=8, **options)
    if name == "medusa":
        assert _kinds(drafter.heads) == {"kernel"}
    else:
        table = (drafter.runner.lean._linear if name == "small_model" else drafter.linear)._table
        assert {entry[1].kind for entry in table.values()} == {"kernel"} and len(table) > 2
    prompt = target.tokenizer("def fibonacci(n):\n    if n < 2:\n        return n\n    ")["input_ids"]
    plain = sf.generate(target, None, prompt, max_new_tokens=32).tokens
    result = sf.generate(target, drafter, prompt, max_new_tokens=32)
    assert result.tokens == plain and result.metrics.draft_steps > 0
    if name == "small_model":
        assert result.metrics.accepted_tokens > 0  # a trained draft: its int8 copy still proposes accepted tokens


def test_lean_linear_uses_int8_for_its_weights_and_float_for_others():
    gen = torch.Generator().manual_seed(1)
    known, other = torch.randn(32, 16, generator=gen), torch.randn(32, 16, generator=gen)
    linear = Int8Linears([(known, None)])
    x = torch.randn(1, 3, 16, generator=gen)
    assert len(linear) == 1 and linear(x, known).shape == (1, 3, 32)
    assert not torch.equal(linear(x, known), nn.functional.linear(x, known))
    assert torch.equal(linear(x, other), nn.functional.linear(x, other))


@pytest.mark.parametrize("bits", [4, 16, True, "8"])
def test_other_bit_widths_are_refused(bits):
    with pytest.raises(ValueError, match="quantize must be 0 \\(float weights\\) or 8 \\(int8 weights\\)"):
        check_bits(bits)


def test_small_model_int8_runs_its_lean_forward_on_int8_and_stays_exact():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = SmallModelDrafter(target, model=draft_model_for(target), gamma=3, quantize=8)
    linear = drafter.runner.lean._linear
    assert isinstance(linear, Int8Linears) and len(linear) == len(_float_linears(drafter.draft))
    plain = sf.generate(target, None, PROMPT, max_new_tokens=24).tokens
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=24)
    assert result.tokens == plain and result.metrics.draft_steps > 0


def test_small_model_int8_is_lossless_under_sampling():
    assert_lossless(lambda t: SmallModelDrafter(t, model=draft_model_for(t), gamma=2, quantize=8),
                    configs=SAMPLING_MATRIX[:1])


@pytest.mark.parametrize("cls", [MedusaDrafter, HydraDrafter])
@pytest.mark.parametrize("share", [False, True])
def test_heads_int8_leave_no_float_linear_and_stay_exact(cls, share):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    drafter = cls(target, weights="random", tree=TREE, share_lm_head=share, quantize=8, policy="constant")
    assert _float_linears(drafter.heads) == []
    if share:
        assert drafter.heads.lm_head is not target.model.get_output_embeddings()
        assert type(target.model.get_output_embeddings()) is nn.Linear  # the target is untouched
    plain = sf.generate(target, None, PROMPT, max_new_tokens=20).tokens
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=20)
    assert result.tokens == plain and result.metrics.draft_steps > 0


def test_quantize_heads_keeps_the_shared_head_out_of_the_state_dict():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    heads = MedusaDrafter(target, weights="random", share_lm_head=True).heads
    keys = set(heads.state_dict())
    quantize_heads(heads)
    assert not any("lm_head" in k for k in heads.state_dict()) and keys  # the shared head is still not saved


@pytest.mark.slow  # the int8 products are the same code as small_model's, whose lossless test runs by default
def test_hydra_int8_is_lossless_under_sampling():
    def factory(t):
        drafter = HydraDrafter(t, weights="random", tree=TREE, quantize=8)
        return drafter

    assert_lossless(factory, configs=SAMPLING_MATRIX[:1], min_depth=2)


def _int8_products(drafter) -> list[int]:
    """Storage keys of the weights the drafter's int8 products hold."""
    return sorted(drafter.linear._table)


@pytest.mark.parametrize("cls", [EagleDrafter, Eagle3Drafter])
@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_eagle_int8_multiplies_every_draft_weight_in_int8_and_stays_exact(cls, mode):
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    head = target.model.get_output_embeddings().weight
    before = head.clone()
    drafter = cls(target, weights="random", mode=mode, gamma=3, top_k=3, total_tokens=6, quantize=8)
    linears = [m.weight.data_ptr() for m in drafter.model.modules() if type(m) is nn.Linear]
    own_head = [head.data_ptr()] if cls is EagleDrafter else []  # eagle reads the target's head: an int8 copy
    assert isinstance(drafter.linear, Int8Linears) and _int8_products(drafter) == sorted(linears + own_head)
    assert drafter.forward.__name__ == "<lambda>"  # the lean layer, which multiplies through drafter.linear
    plain = sf.generate(target, None, PROMPT, max_new_tokens=24).tokens
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=24)
    assert result.tokens == plain and result.metrics.draft_steps > 0
    assert torch.equal(head, before) and type(target.model.get_output_embeddings()) is nn.Linear


def test_eagle_int8_with_a_float_head_leaves_the_head_rows_float_and_stays_exact():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    head = target.model.get_output_embeddings().weight
    drafter = EagleDrafter(target, weights="random", mode="tree", gamma=3, top_k=3, total_tokens=6, quantize=8,
                           quantize_head=False)
    linears = [m.weight.data_ptr() for m in drafter.model.modules() if type(m) is nn.Linear]
    assert _int8_products(drafter) == sorted(linears) and head.data_ptr() not in _int8_products(drafter)
    hidden = torch.randn(3, target.model.config.hidden_size, generator=torch.Generator().manual_seed(0),
                         dtype=target.model.dtype)
    float_head = EagleDrafter(target, weights="random", quantize=0)
    assert torch.allclose(drafter._draft_logits(hidden), float_head._draft_logits(hidden), atol=1e-5)  # float rows
    plain = sf.generate(target, None, PROMPT, max_new_tokens=24).tokens
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=24)
    assert result.tokens == plain and result.metrics.draft_steps > 0


def test_eagle_quantize_head_false_needs_quantize_8():
    target = tiny_target("llama", vocab_size=64)
    with pytest.raises(ValueError, match=r"eagle quantize_head=false applies to quantize=8 \(the float draft's head "
                                         r"is float\)"):
        EagleDrafter(target, weights="random", quantize_head=False)
    with pytest.raises(ValueError, match="eagle quantize_head must be true or false, got 'no'"):
        EagleDrafter(target, weights="random", quantize=8, quantize_head="no")


def test_eagle_int8_drafts_differ_from_float_drafts():
    """The int8 products are the ones drafting: the draft logits move off the float ones (by a little)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    gen, dtype = torch.Generator().manual_seed(0), target.model.dtype
    hidden = torch.randn(4, target.model.config.hidden_size, generator=gen, dtype=dtype)
    float_drafter = Eagle3Drafter(target, weights="random", seed=3)
    int8_drafter = Eagle3Drafter(target, weights="random", seed=3, quantize=8)
    exact, int8 = float_drafter._draft_logits(hidden), int8_drafter._draft_logits(hidden)
    assert not torch.equal(exact, int8) and (exact - int8).abs().max() < 0.05 * exact.abs().max()
    features = torch.randn(2, int8_drafter.model.fc.in_features, generator=gen, dtype=dtype)
    assert not torch.equal(float_drafter._fuse(features), int8_drafter._fuse(features))


def test_eagle_int8_needs_the_lean_layer():
    target = tiny_target("gpt2", vocab_size=64)
    with pytest.raises(ValueError, match="quantize=8 runs the draft through its lean layer, which cannot run this "
                                         "model: family 'gpt2'"):
        EagleDrafter(target, weights="random", quantize=8)
    with pytest.raises(ValueError, match="quantize must be 0"):
        Eagle3Drafter(target, weights="random", quantize=4)


@pytest.mark.parametrize("cls", [EagleDrafter, Eagle3Drafter])
def test_eagle_int8_chain_is_lossless_under_sampling(cls):
    [fit] = assert_lossless(lambda t: cls(t, weights="random", mode="chain", gamma=2, quantize=8),
                            configs=SAMPLING_MATRIX[:1], min_depth=2)
    assert fit.depth.deepest_verified >= 2
