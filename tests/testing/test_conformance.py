import pytest
import torch

from specfamily.core.types import SamplingConfig
from specfamily.testing import (
    SAMPLING_MATRIX,
    RandomTreeDrafter,
    WrongDrafter,
    assert_greedy_equivalent,
    assert_lossless,
    exact_distribution,
    tiny_target,
)
from specfamily.testing.conformance import chi_square


def test_exact_distribution_sums_to_one_and_matches_chain_rule():
    target = tiny_target("llama")
    sampling = SamplingConfig(temperature=1.0)
    probs = exact_distribution(target, [1, 2, 3], 2, sampling)
    assert probs.sum().item() == pytest.approx(1.0)
    first = torch.softmax(target.model(torch.tensor([[1, 2, 3]])).logits[0, -1].float(), -1).double()
    assert torch.allclose(probs.view(8, 8).sum(1), first, atol=1e-6)


def test_chi_square_pools_small_cells():
    probs = torch.tensor([0.5, 0.3, 0.199, 0.001], dtype=torch.float64)
    _, p_value, cells = chi_square(torch.tensor([500.0, 300.0, 199.0, 1.0]), probs)
    assert cells == 3 and p_value > 0.9  # the 0.001 cell joins the next smallest
    _, p_value, _ = chi_square(torch.tensor([700.0, 200.0, 99.0, 1.0]), probs)
    assert p_value < 1e-6


def test_too_few_samples_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="3 samples are too few for a chi-square test"):
        chi_square(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64))


def test_small_cells_are_pooled_into_several_buckets():
    probs = torch.full((100,), 0.01, dtype=torch.float64)
    _, _, cells = chi_square(torch.full((100,), 10.0), probs)
    assert cells == 100
    _, _, cells = chi_square(torch.full((100,), 2.0), probs)  # expected 2 per cell: buckets of 3 cells
    assert cells == 33


def test_suite_rejects_the_wrong_drafter():
    with pytest.raises(AssertionError, match="not lossless under"):
        assert_lossless(lambda target: WrongDrafter(target), configs=SAMPLING_MATRIX[:1])


def test_plain_decoding_is_lossless():
    assert_lossless(lambda target: None, configs=SAMPLING_MATRIX[1:2])


def test_deterministic_random_tree_is_lossless():
    assert_lossless(lambda target: RandomTreeDrafter(target, nodes=6), configs=SAMPLING_MATRIX[2:3])


def test_sampled_random_tree_is_lossless():
    assert_lossless(lambda target: RandomTreeDrafter(target, nodes=6, sampled=True), configs=SAMPLING_MATRIX[:1])


def test_random_tree_is_greedy_equivalent():
    assert_greedy_equivalent(lambda target: RandomTreeDrafter(target, nodes=8))


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_random_tree_full_matrix(sampled, family):
    assert_lossless(lambda target: RandomTreeDrafter(target, sampled=sampled), family=family)
