"""The recycling drafter (Token Recycling): template, table, tree growth, greedy identity, losslessness."""

import numpy as np
import pytest
import torch

import specfamily as sf
from specfamily.core.plugins import get_registry
from specfamily.core.types import VerifyOutcome
from specfamily.drafters.recycling.config import RecyclingConfig
from specfamily.drafters.recycling.drafter import RecyclingDrafter
from specfamily.drafters.recycling.scored import grow_scored
from specfamily.drafters.recycling.table import AdjacencyTable
from specfamily.drafters.recycling.template import TEMPLATES, grow, make_template, rank_paths
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, tiny_target


def test_registered_with_its_config_and_defaults():
    assert get_registry().entry("recycling").config is RecyclingConfig
    target = tiny_target("llama", vocab_size=16)
    drafter = sf.create_drafter("recycling", target)
    assert isinstance(drafter, RecyclingDrafter) and drafter.policy.__class__.__name__ == "AutoPolicy"
    assert drafter.template is None and drafter.default_gamma == 6  # scored: best first, at most the reference's depth
    assert (drafter.config.template, drafter.config.max_tree_size, drafter.config.threshold) == ("scored", 8, 0.35)


def test_the_reference_template_has_80_nodes_six_deep_and_every_prefix_is_a_tree():
    paths = rank_paths(TEMPLATES["2.2.2"])
    assert len(paths) == 80 and max(map(len, paths)) == 6 and max(p[-1] for p in paths) == 7
    full = make_template("2.2.2")
    assert len(full) == 80 and full.depth == 6
    assert all(parent < i for i, parent in enumerate(full.parents))
    cut = make_template("2.2.2", max_tree_size=5)
    # by depth + summed rank: rank 0, rank 1, rank 0 under rank 0, rank 2, rank 1 under rank 0
    assert (cut.parents, cut.ranks, cut.depths) == ((-1, -1, 0, -1, 0), (0, 1, 0, 2, 1), (1, 1, 2, 1, 2))


def test_a_template_wider_than_top_k_is_refused():
    with pytest.raises(ValueError, match="template '2.2.2' uses successor rank 7; it needs top_k >= 8, got 4"):
        make_template("2.2.2", top_k=4)
    assert make_template("2.2.2", max_tree_size=5, top_k=3).ranks == (0, 1, 0, 2, 1)


def test_grow_follows_the_table_merges_equal_siblings_and_skips_unknown_rows():
    successors = np.array([[1, 2, 3], [2, 2, 0], [0, 1, 3], [1, 1, 1]])  # row 1: ranks 0 and 1 are both 2
    known = np.array([True, True, True, False])
    template = make_template("2.2.2", max_tree_size=7, top_k=3)
    assert template.parents == (-1, -1, 0, -1, 0, 1, 2) and template.ranks == (0, 1, 0, 2, 1, 0, 0)
    tokens, parents = grow(0, successors, known, template, gamma=3)
    # [0] -> 1, [1] -> 2, [0,0] -> 1's rank 0 = 2, [2] -> 3, [0,1] -> 1's rank 1 = 2 again: merged into [0,0],
    # [1,0] -> 2's rank 0 = 0, [0,0,0] -> (1, 2)'s rank 0 = 0
    assert tokens == [1, 2, 2, 3, 0, 0] and parents == [-1, -1, 0, -1, 1, 2]
    successors[3] = [2, 2, 2]  # an unknown row proposes nothing, whatever it holds
    assert grow(0, successors, known, template, gamma=3) == (tokens, parents)
    shallow, _ = grow(0, successors, known, template, gamma=1)
    assert shallow == [1, 2, 3]
    assert grow(3, successors, known, template, gamma=3) == ([], [])  # an unknown root proposes nothing
    assert grow(0, successors, known, template, gamma=3, stop={1, 2, 3})[0] == [1, 2, 3]  # nothing after a stop


def test_table_update_keeps_each_fed_tokens_top_k_the_last_write_winning():
    table = AdjacencyTable.empty(6, 2)
    logits = torch.tensor([[0.0, 5, 4, 0, 0, 0], [9, 0, 0, 0, 0, 8], [0, 0, 0, 7, 6, 0]])
    table.update([4, 1, 4], logits)
    assert table.successors[1].tolist() == [0, 5] and table.successors[4].tolist() == [3, 4]
    assert table.known.tolist() == [False, True, False, False, True, False]
    with pytest.raises(ValueError, match="2 tokens but 3 rows of logits"):
        table.update([1, 2], logits)


def test_observe_learns_from_every_drafted_row_and_a_second_request_is_drafted_deeper():
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = RecyclingDrafter(target, gamma=3, max_tree_size=12, template="2.2.2")
    plain = sf.generate(target, None, prompt, max_new_tokens=40).tokens
    first = sf.generate(target, drafter, prompt, max_new_tokens=40)
    second = sf.generate(target, drafter, prompt, max_new_tokens=40)
    assert first.tokens == plain and second.tokens == plain
    assert second.metrics.mean_accepted_length > first.metrics.mean_accepted_length
    assert second.metrics.mean_accepted_length > 2.5  # the table now holds this text's successors
    fresh = RecyclingDrafter(target, gamma=3, max_tree_size=12, keep=False, template="2.2.2")
    sf.generate(target, fresh, prompt, max_new_tokens=40)
    again = sf.generate(target, fresh, prompt, max_new_tokens=40)
    assert again.metrics.mean_accepted_length == first.metrics.mean_accepted_length  # keep=False: starts empty


def test_observe_without_a_proposal_updates_the_root_row_only():
    target = tiny_target("llama", vocab_size=16)
    drafter = RecyclingDrafter(target, gamma=2)
    from specfamily.core.context import DecodeContext
    ctx = DecodeContext(target, torch.tensor([1, 2]), sf.SamplingConfig(), torch.Generator(), tokens=[1, 2])
    drafter.begin(ctx)
    logits = torch.arange(16.0)[None]
    drafter.observe(VerifyOutcome([7], [], 0, logits=logits))
    assert drafter.table.known.nonzero()[0].tolist() == [2]
    assert drafter.table.successors[2].tolist() == list(range(15, 7, -1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, "top_k must be an integer >= 1, got 0"),
        ({"template": "9.9"}, "template must be one of 2.2.2, scored, got '9.9'"),
        ({"threshold": 1.0}, r"threshold must be a number in \[0, 1\), got 1.0"),
        ({"max_tree_size": 0}, "max_tree_size must be an integer >= 1, got 0"),
        ({"keep": "yes"}, "keep must be true or false, got 'yes'"),
        ({"gamma": 0}, "gamma must be an integer >= 1, got 0"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        RecyclingConfig(**options)


def test_greedy_equals_transformers_with_trees_proposed():
    reports = assert_greedy_equivalent(lambda t: RecyclingDrafter(t, gamma=3, max_tree_size=12,
                                                                  template="2.2.2"))
    assert all(report.drafted_passes > 0 for report in reports)


@pytest.mark.parametrize("sampling", SAMPLING_MATRIX, ids=["t1", "t07-top_p09", "top_k5"])
def test_lossless_at_depth_two(sampling):
    [fit] = assert_lossless(lambda t: RecyclingDrafter(t, gamma=3, max_tree_size=12, template="2.2.2"),
                            configs=[sampling],
                            min_depth=2)
    assert fit.passed


def test_table_keeps_the_probabilities_of_its_successors():
    table = AdjacencyTable.empty(4, 2)
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3, 0.0]]))
    table.update([2], logits)
    assert table.successors[2].tolist() == [1, 2]
    np.testing.assert_allclose(table.scores[2], [0.6, 0.3], rtol=1e-6)
    assert table.scores[0].tolist() == [0.0, 0.0]


def test_grow_scored_keeps_the_most_likely_paths_above_the_threshold_parents_first():
    successors = np.array([[1, 2], [2, 0], [0, 1], [1, 2]])
    scores = np.array([[0.7, 0.2], [0.9, 0.1], [0.5, 0.4], [0.9, 0.1]], dtype=np.float32)
    known = np.array([True, True, True, False])
    # from 0: 1 (.7), 1->2 (.63), 1->2->0 (.315), 2 (.2), 1->2->1 (.252), 1->0 (.07), ...
    tokens, parents = grow_scored(0, successors, scores, known, size=4, gamma=3, threshold=0.0)
    assert tokens == [1, 2, 0, 1] and parents == [-1, 0, 1, 1]
    tokens, parents = grow_scored(0, successors, scores, known, size=8, gamma=3, threshold=0.25)
    assert tokens == [1, 2, 0, 1] and parents == [-1, 0, 1, 1]  # .2 and below left out
    assert grow_scored(0, successors, scores, known, size=8, gamma=1, threshold=0.0) == ([1, 2], [-1, -1])
    assert grow_scored(0, successors, scores, known, size=8, gamma=3, threshold=0.8) == ([], [])  # unsure: nothing
    assert grow_scored(3, successors, scores, known, size=8, gamma=3, threshold=0.0) == ([], [])  # unknown root
    assert grow_scored(0, successors, scores, known, size=8, gamma=3, threshold=0.0, stop={1, 2}) == ([1, 2], [-1, -1])


def test_scored_drafter_is_greedy_identical_and_drafts_from_the_recycled_probabilities():
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float64)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    drafter = RecyclingDrafter(target, gamma=3, template="scored", max_tree_size=12, threshold=0.01)
    assert drafter.template is None and drafter.default_gamma == 6  # the depth cap without a gamma
    plain = sf.generate(target, None, prompt, max_new_tokens=40).tokens
    first = sf.generate(target, drafter, prompt, max_new_tokens=40)
    second = sf.generate(target, drafter, prompt, max_new_tokens=40)
    assert first.tokens == plain and second.tokens == plain
    assert second.metrics.mean_accepted_length > first.metrics.mean_accepted_length > 1.0
    never = RecyclingDrafter(target, gamma=3, template="scored", threshold=0.999)
    assert sf.generate(target, never, prompt, max_new_tokens=20).metrics.mean_accepted_length == 1.0


def test_scored_greedy_equals_transformers_with_trees_proposed():
    reports = assert_greedy_equivalent(lambda t: RecyclingDrafter(t, gamma=3, template="scored", max_tree_size=12,
                                                                  threshold=0.0))
    assert all(report.drafted_passes > 0 for report in reports)


@pytest.mark.parametrize("sampling", SAMPLING_MATRIX, ids=["t1", "t07-top_p09", "top_k5"])
def test_scored_lossless_at_depth_two(sampling):
    [fit] = assert_lossless(lambda t: RecyclingDrafter(t, gamma=3, template="scored", max_tree_size=12, threshold=0.0),
                            configs=[sampling], min_depth=2)
    assert fit.passed
