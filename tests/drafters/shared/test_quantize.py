"""8-bit drafts (specfamily.drafters.shared.quantize): int8 copies of the draft's weights, exactness kept."""

import pytest
import torch
from torch import nn

import specfamily as sf
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.hydra_drafter import HydraDrafter
from specfamily.drafters.shared.quantize import Int8Linears, check_bits, int8_linear, quantize_heads
from specfamily.drafters.small_model.drafter import SmallModelDrafter
from specfamily.testing import SAMPLING_MATRIX, assert_lossless, draft_model_for, tiny_target

PROMPT = [3, 1, 4, 1, 5]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def _float_linears(module: nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if type(m) is nn.Linear]


def test_int8_linear_is_close_to_float_and_holds_int8_weights():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(5, 64, generator=gen)
    q = int8_linear(weight, bias)
    assert q.inner.weight().dtype == torch.qint8
    exact = nn.functional.linear(x, weight, bias)
    assert (q(x) - exact).abs().max() < 0.05 * exact.abs().max()
    assert not torch.equal(q(x), exact)  # it did run in int8


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
