import pytest
import torch

from specfamily.core.sampling import greedy_tokens, top_k_filter, top_p_filter, warp
from specfamily.core.types import SamplingConfig


def test_temperature_zero_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    assert warp(logits, SamplingConfig()).tolist() == [[0, 1, 0], [1, 0, 0]]


def test_temperature_scales_before_softmax():
    logits = torch.tensor([1.0, 2.0, 4.0])
    expected = torch.softmax(logits / 0.5, dim=-1)
    assert torch.allclose(warp(logits, SamplingConfig(temperature=0.5)), expected)


def test_top_k_keeps_ties_at_kth_value():
    logits = torch.tensor([3.0, 1.0, 1.0, 0.0])
    kept = top_k_filter(logits, 2)
    assert torch.isinf(kept).tolist() == [False, False, False, True]


def test_top_p_keeps_the_crossing_token():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    # 0.5 < 0.7, 0.5 + 0.3 crosses 0.7: both kept, the rest dropped
    assert torch.allclose(top_p_filter(probs, 0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # exactly reaching top_p stops there
    assert torch.allclose(top_p_filter(probs, 0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_order_is_temperature_top_k_softmax_top_p():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    config = SamplingConfig(temperature=0.7, top_k=3, top_p=0.9)
    scaled = logits / 0.7
    probs = torch.softmax(torch.where(scaled >= scaled.topk(3).values[-1], scaled, -torch.inf), -1)
    sorted_p, order = probs.sort(descending=True)
    keep = (sorted_p.cumsum(0) - sorted_p) < 0.9
    manual = torch.zeros_like(probs)
    manual[order[keep]] = probs[order[keep]]
    assert torch.allclose(warp(logits, config), manual / manual.sum())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature must be a finite number >= 0, got -0.1"),
        ({"top_k": -1}, "top_k must be an integer >= 0 (0 disables it), got -1"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ],
)
def test_invalid_sampling_values(kwargs, message):
    with pytest.raises(ValueError) as info:
        SamplingConfig(**kwargs)
    assert str(info.value) == message


def test_greedy_tokens_are_argmax_ties_and_nans_included():
    """greedy_tokens goes through max(-1).indices for speed: it must give argmax's index on every row, the first of
    tied maxima and the first NaN included, over the target's vocabulary size and a 1-D row."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 49_152, generator=generator)
    logits[1, [7, 40_000]] = 50.0  # tied maxima: the first wins
    logits[2, [3, 9]] = float("nan")  # NaN is the maximum, the first one
    logits[3] = 1.0  # all tied
    logits[4, 0] = float("inf")
    logits[5, -1] = 99.0
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))
    assert greedy_tokens(logits).tolist()[1:] == [7, 3, 0, 0, 49_151]
    assert int(greedy_tokens(logits[5])) == 49_151
