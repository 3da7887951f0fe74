"""Level-conditional tests: tokens decided at one draft level, each against its own prefix's exact law."""

from __future__ import annotations

import pytest
import torch

from specfamily.core.types import Draft
from specfamily.testing.depth import DepthStats, pass_levels
from specfamily.testing.levels import LevelTokens, conditional_laws, level_tests, merge_map, pooled_test, ranked
from specfamily.testing.sampling_run import joint_law
from specfamily.testing.stats import marginal_law
from specfamily.testing.tiny import single_thread


def _random_laws(rows: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    return torch.softmax(2 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64), dim=-1)


def test_the_pooled_test_holds_its_level_on_draws_that_are_not_identically_distributed():
    """400 simulated levels of 300 tokens, each token with its own law: rejections at 5% and 1% near nominal, in
    token and in rank space."""
    gen = torch.Generator().manual_seed(0)
    p_tokens, p_ranks = [], []
    with single_thread():
        for _ in range(400):
            probs = _random_laws(300, 8, gen)
            group = LevelTokens(1, torch.multinomial(probs, 1, generator=gen).view(-1), probs)
            p_tokens.append(pooled_test("tokens", group).p_value)
            p_ranks.append(pooled_test("ranks", ranked(group)).p_value)
    for p_values in (torch.tensor(p_tokens), torch.tensor(p_ranks)):
        assert 0.025 <= float((p_values < 0.05).float().mean()) <= 0.08
        assert float((p_values < 0.01).float().mean()) <= 0.025


def test_rank_space_sees_a_deviation_that_cancels_between_prefixes_in_token_space():
    """Two prefixes with opposite favourites; the drafter's system accepts each favourite 0.1 too often. Pooled by
    token the two deviations cancel; by rank both move the first rank up."""
    gen = torch.Generator().manual_seed(1)
    laws = torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.5, 0.2]], dtype=torch.float64)
    moved = torch.tensor([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2]], dtype=torch.float64)
    which = torch.arange(2000) % 2
    tokens = torch.multinomial(moved[which], 1, generator=gen).view(-1)
    group = LevelTokens(1, tokens, laws[which])
    assert pooled_test("tokens", group).p_value > 1e-3
    assert pooled_test("ranks", ranked(group)).p_value < 1e-10


def test_ranks_follow_each_law_with_ties_in_index_order():
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.4, 0.2, 0.4]], dtype=torch.float64)
    group = ranked(LevelTokens(2, torch.tensor([2, 2]), probs))
    assert group.tokens.tolist() == [1, 1]  # token 2 is second in both (behind token 0's tie in the second row)
    assert group.probs.tolist() == [[0.6, 0.3, 0.1], [0.4, 0.4, 0.2]]


def test_small_cells_merge_until_each_expects_five():
    expected = torch.tensor([100.0, 3.0, 3.0, 1.0, 0.0, 20.0])
    cells = merge_map(expected)
    assert cells[4] == cells[3] == cells[1] == cells[2]  # 0 + 1 + 3 + 3 = 7 >= 5
    assert len(set(cells.tolist())) == 3
    assert merge_map(torch.tensor([1.0, 1.0, 1.0])).tolist() == [0, 0, 0]


def test_one_cell_left_is_no_test():
    group = LevelTokens(1, torch.tensor([0, 0]), torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64))
    assert pooled_test("tokens", group) is None


def test_conditional_laws_are_the_joints_ratios():
    gen = torch.Generator().manual_seed(2)
    steps = [_random_laws(1, 4, gen), _random_laws(4, 4, gen), _random_laws(16, 4, gen)]
    joint = joint_law(steps)
    sequences = torch.tensor([[1, 2, 3], [0, 0, 1]])
    laws = conditional_laws(steps, sequences)
    pairs = marginal_law(joint, 4, 3, (0, 1)).view(4, 4)
    assert torch.allclose(laws[0, 0], marginal_law(joint, 4, 3, (0,)))
    assert torch.allclose(laws[0, 1], pairs[1] / pairs[1].sum())
    assert torch.allclose(laws[1, 2], joint.view(4, 4, 4)[0, 0] / joint.view(4, 4, 4)[0, 0].sum())


def test_level_tests_count_the_tokens_of_each_level():
    gen = torch.Generator().manual_seed(3)
    steps = [_random_laws(8**t, 8, gen) for t in range(3)]
    sequences = torch.randint(0, 8, (50, 3), generator=gen)
    levels = torch.tensor([[1, 2, 0]] * 40 + [[0, -1, -1]] * 10)
    tests, counts = level_tests(sequences, levels, conditional_laws(steps, sequences), depth=3)
    assert counts == [50, 40, 40, 0]
    assert {test.name for test in tests} == {f"level {level} {space}" for level in (0, 1, 2)
                                             for space in ("tokens", "ranks")}


def test_a_pass_decides_each_token_at_the_depth_it_tried():
    tree = Draft([4, 5, 6, 7, 5], [-1, -1, 0, 1, 3])  # node 1 -> 3 -> 4, node 0 -> 2
    assert pass_levels(tree, [1, 3, 4], 4) == [1, 2, 3, 0]  # node 4 is a leaf: the bonus token tried nothing
    assert pass_levels(tree, [0], 2) == [1, 2]  # node 0's child 2 was tried (and rejected)
    assert pass_levels(tree, [0, 2], 3) == [1, 2, 0]
    assert pass_levels(tree, [1, 3], 1) == [1]  # the budget kept one token of the pass
    assert pass_levels(Draft.chain([1, 2]), [], 1) == [1]


def test_depth_stats_keep_a_level_per_generated_token():
    stats = DepthStats()
    stats.begin_request()
    stats.set_levels(1, [1, 2])  # token 0 came from a pass without a draft
    stats.finish_request(5)
    assert stats.levels == [[0, 1, 2, 0, 0]]
    assert stats.tokens_at_level(0) == 3 and stats.tokens_at_level(2) == 1


@pytest.mark.parametrize("space", ["tokens", "ranks"])
def test_the_pooled_test_catches_a_moved_pooled_law(space):
    """Every token's law moved by total variation 0.1 toward token 0: 1000 tokens reject at 1e-4."""
    gen = torch.Generator().manual_seed(4)
    probs = _random_laws(1000, 8, gen)
    moved = 0.9 * probs + 0.1 * torch.nn.functional.one_hot(torch.zeros(1000, dtype=torch.long), 8)
    group = LevelTokens(3, torch.multinomial(moved, 1, generator=gen).view(-1), probs)
    view = group if space == "tokens" else ranked(group)
    assert pooled_test(space, view).p_value < 1e-4
