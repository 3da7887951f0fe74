import math

import pytest
import torch

from specfamily.drafters.medusa.tree import (
    CostCurve,
    JointRanks,
    build_tree,
    chain_paths,
    choose_tree,
    expected_accepted,
    greedy_paths,
    path_probability,
    tree_speedups,
)

ACC = [[0.5, 0.2, 0.1], [0.4, 0.1, 0.05]]  # (heads, ranks)


def test_buffers_of_a_small_tree_given_out_of_order():
    tree = build_tree([(1, 0), (0,), (0, 1), (1,), (0, 0), (0, 0, 2)])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 2))
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.ranks.tolist() == [0, 1, 0, 1, 0, 2]
    assert tree.top_k == 3
    # flat index into a (depth, top_k) table of top-k tokens
    assert tree.gather.tolist() == [0, 1, 3, 4, 3, 8]
    assert tree.prefix == (0, 2, 5, 6) and tree.depth == 3 and tree.size == 6
    # leaves: (0, 1), (1, 0), (0, 0, 2), each path from depth 1 down, -1 padded
    assert tree.retrieval.tolist() == [[0, 3, -1], [1, 4, -1], [0, 2, 5]]
    assert tree.parents_at(2).tolist() == [-1, -1, 0, 0, 1]
    assert tree.parents_at(9).tolist() == tree.parents.tolist()


def test_chain_paths():
    tree = build_tree(chain_paths(3))
    assert tree.parents.tolist() == [-1, 0, 1] and tree.gather.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([(0,), (0, 0, 1)], r"tree path \(0, 0, 1\) has no parent \(0, 0\) in the tree"),
        ([(0,), (0,)], "tree paths must be distinct"),
        ([], "a Medusa tree needs at least one path"),
        ([(0,), (-1,)], r"tree ranks must be integers >= 0, got \(-1,\)"),
        ([()], "every tree path must be a non-empty tuple of ranks"),
    ],
)
def test_invalid_trees_are_refused(paths, message):
    with pytest.raises(ValueError, match=message):
        build_tree(paths)


def test_greedy_paths_follow_path_probabilities():
    # node probabilities: (0,) .5, (1,) .2, (0,0) .2, (2,) .1, (0,1) .05, (1,0) .08, (0,2) .025 ...
    assert greedy_paths(ACC, 5) == [(0,), (0, 0), (1,), (2,), (1, 0)]
    assert expected_accepted(greedy_paths(ACC, 5), ACC) == pytest.approx(0.5 + 0.2 + 0.2 + 0.1 + 0.08)


def test_greedy_paths_are_prefix_closed_at_every_size():
    acc = [[0.7, 0.1, 0.05, 0.02], [0.5, 0.2, 0.1, 0.01], [0.4, 0.3, 0.1, 0.1]]
    paths = greedy_paths(acc, 40)
    for n in range(1, len(paths) + 1):
        build_tree(paths[:n])  # raises if a prefix is not a valid tree
    probs = [math.prod(acc[d][r] for d, r in enumerate(p)) for p in paths]
    assert probs == sorted(probs, reverse=True)


def test_greedy_paths_stop_when_the_tree_is_full():
    assert len(greedy_paths([[0.5, 0.5]], 10)) == 2


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve((1, 5, 9), (1.0, 2.0, 2.4))
    assert curve(1) == 1.0 and curve(3) == pytest.approx(1.5) and curve(7) == pytest.approx(2.2)
    assert curve(13) == pytest.approx(2.8)
    with pytest.raises(ValueError, match="sizes must increase"):
        CostCurve((1, 3, 2), (1.0, 1.0, 1.0))


def test_tree_size_follows_the_verify_cost():
    flat = CostCurve((1, 100), (1.0, 1.0))
    steep = CostCurve((1, 2), (1.0, 2.0))  # every fed token costs a full pass
    assert len(choose_tree(ACC, flat, c=0.0, max_nodes=9)) == 9
    assert len(choose_tree(ACC, steep, c=0.0, max_nodes=9)) == 1
    speedups = tree_speedups(ACC, steep, 0.0, 3)
    assert speedups == pytest.approx([1.5 / 2.0, 1.7 / 3.0, 1.9 / 4.0])


def test_joint_rank_model_uses_the_empirical_path_frequencies():
    # rank of the right token in head 0 and head 1 at five positions; 2 = not in the top-2
    ranks = torch.tensor([[0, 0], [0, 0], [0, 1], [1, 0], [2, 0]])
    model = JointRanks(ranks, top_k=2)
    assert [model(p) for p in [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]] == pytest.approx([.6, .2, .4, .2, .2, 0])
    # independent heads would say (1, 0) has .2 * .8 and (0, 0) has .6 * .8
    assert path_probability((1, 0), [[0.6, 0.2], [0.8, 0.2]]) == pytest.approx(0.16)
    paths = greedy_paths(model, 4)
    assert paths == [(0,), (0, 0), (0, 1), (1,)]
    assert expected_accepted(paths, model) == pytest.approx(1.4)
    # a free verifier takes every node that can be accepted, but not (1, 1), which never is
    assert choose_tree(model, CostCurve((1, 100), (1.0, 1.0)), max_nodes=6) == [(0,), (0, 0), (0, 1), (1,), (1, 0)]
    with pytest.raises(ValueError, match="rank table must be a non-empty"):
        JointRanks(torch.zeros(0, 2, dtype=torch.long), 2)
