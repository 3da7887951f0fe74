"""EAGLE-2 dynamic tree: expansion, reranking and pruning on hand-made log-probability tables; sampled trees
(children drawn without replacement, slot scores, draw-order prefixes, conditional q)."""

import math

import pytest
import torch

from specfamily.drafters.shared.dynamic_tree import (
    Candidates,
    DraftTree,
    expand,
    expand_sampled,
    grow_tree,
    is_draw_prefix,
    select_tree,
    sibling_q,
)

V = 6


def _logp(probs: dict[int, float]) -> torch.Tensor:
    """(V,) log-probabilities with the given masses; the rest spread evenly."""
    rest = (1.0 - sum(probs.values())) / (V - len(probs))
    row = torch.full((V,), rest)
    for token, p in probs.items():
        row[token] = p
    return row.log()


# Hand-made drafter: the children distribution after each path of tokens from the root.
TABLE = {
    (): {0: 0.6, 1: 0.3},
    (0,): {2: 0.9, 3: 0.05},
    (1,): {4: 0.5, 5: 0.4},
    (0, 2): {1: 0.8, 5: 0.1},
    (0, 3): {0: 0.5},
    (1, 4): {3: 0.7},
    (1, 5): {2: 0.6},
}


class TableStep:
    """step() for grow_tree that looks rows up in TABLE by the path of each fed node; records the calls.

    A fed node's parent was fed one depth earlier (or is the root), so paths can be rebuilt from the calls.
    """

    def __init__(self, rows=None):
        self.rows = rows or (lambda path: _logp(TABLE.get(path, {})))
        self.paths: dict[int, tuple[int, ...]] = {}
        self.calls: list[list[tuple[int, ...]]] = []

    def __call__(self, nodes, tokens, parents):
        fed = []
        for node, token, parent in zip(nodes.tolist(), tokens.tolist(), parents.tolist(), strict=True):
            self.paths[node] = (() if parent < 0 else self.paths[parent]) + (token,)
            fed.append(self.paths[node])
        self.calls.append(fed)
        return torch.stack([self.rows(path) for path in fed])


def _grow(gamma, top_k, total):
    step = TableStep()
    return grow_tree(_logp(TABLE[()]), step, gamma, top_k, total), step


def _paths(tree):
    paths = []
    for i, (token, parent) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True)):
        assert parent < i
        paths.append((() if parent < 0 else paths[parent]) + (token,))
    return paths


def test_hand_made_table_keeps_the_best_paths():
    tree, step = _grow(gamma=3, top_k=2, total=5)
    # depth 1: 0 (.6), 1 (.3); depth 2 from both: 0-2 (.54), 1-4 (.15), 1-5 (.12), 0-3 (.03)
    # depth 3 expands the 2 best of depth 2: 0-2-1 (.432), 0-2-5 (.054), 1-4-3 (.105), 1-4-x (.15 * .06)
    assert step.calls == [[(0,), (1,)], [(0, 2), (1, 4)]]
    assert _paths(tree) == [(0,), (1,), (0, 2), (1, 4), (0, 2, 1)]
    assert tree.parents.tolist() == [-1, -1, 0, 1, 2]
    expected = [0.6, 0.3, 0.54, 0.15, 0.432]
    assert tree.scores.exp().tolist() == pytest.approx(expected, rel=1e-5)


def test_nodes_outside_the_budget_are_not_expanded():
    tree, step = _grow(gamma=4, top_k=2, total=3)
    # a kept child ranks behind its parent, so only the best total - 1 = 2 nodes are worth expanding:
    # after depth 2 they are 0, 0-2 (.6, .54); after depth 3 they still are, so depth 4 is never fed
    assert step.calls == [[(0,), (1,)], [(0, 2)]]
    assert _paths(tree) == [(0,), (0, 2), (0, 2, 1)]


def test_expansion_stops_early_when_nothing_can_be_kept():
    tree, step = _grow(gamma=6, top_k=2, total=1)
    assert step.calls == []  # the single best node is the root's best child
    assert _paths(tree) == [(0,)]


def test_siblings_are_distinct_and_most_probable_first():
    tree, _ = _grow(gamma=3, top_k=3, total=20)
    paths = _paths(tree)
    assert len(set(paths)) == len(paths)
    for parent in set(tree.parents.tolist()):
        siblings = [i for i, p in enumerate(tree.parents.tolist()) if p == parent]
        scores = tree.scores[siblings]
        assert torch.all(scores[:-1] >= scores[1:])


def test_select_tree_keeps_ancestors_and_breaks_ties_by_index():
    # node 2 has the same score as its parent 1 (a child of probability 1); ties go to the lower index
    candidates = Candidates(
        tokens=torch.tensor([5, 6, 7, 8]),
        parents=torch.tensor([-1, -1, 1, 2]),
        scores=torch.tensor([-1.0, -0.5, -0.5, -0.5]),
        ranks=torch.tensor([0, 1, 0, 0]),
        rows=torch.tensor([0, 0, 1, 2]),
    )
    tree = select_tree(candidates, 2)
    assert tree.tokens.tolist() == [5, 6, 7]  # 6 is the root's second child: its earlier sibling 5 comes along
    assert tree.parents.tolist() == [-1, -1, 1]
    assert tree.ranks.tolist() == [0, 1, 0] and is_draw_prefix(tree)


def test_select_tree_closes_over_ancestors_even_with_inconsistent_scores():
    zero = torch.zeros(3, dtype=torch.long)
    candidates = Candidates(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 1]), torch.tensor([-3.0, -2.0, -0.1]),
                            zero, zero)
    tree = select_tree(candidates, 1)
    assert tree.tokens.tolist() == [1, 2, 3]
    assert tree.parents.tolist() == [-1, 0, 1]


def _brute_force(root_logp, rows, gamma, top_k, total):
    """EAGLE-2 without pruning: expand the top_k of every depth, rerank everything (reference)."""
    cands = []  # (score, index, token, parent, path)
    frontier = [(-1, ())]
    logps = {(): root_logp}
    for _ in range(gamma):
        new = []
        for parent, path in frontier:
            row = logps[path] if path in logps else rows(path)
            values, tokens = row.topk(min(top_k, V))
            base = 0.0 if parent < 0 else cands[parent][0]
            for v, t in zip(values.tolist(), tokens.tolist(), strict=True):
                cands.append((base + v, len(cands), t, parent, path + (t,)))
                new.append(cands[-1])
        best = sorted(new, key=lambda c: (-c[0], c[1]))[:top_k]
        frontier = [(c[1], c[4]) for c in best]
    kept = sorted(sorted(cands, key=lambda c: (-c[0], c[1]))[:total], key=lambda c: c[1])
    return [c[4] for c in kept]


@pytest.mark.parametrize("seed", range(5))
def test_pruned_growth_equals_the_unpruned_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    cache = {}

    def rows(path):
        if path not in cache:
            cache[path] = torch.log_softmax(3 * torch.randn(V, generator=gen, dtype=torch.float64), -1).float()
        return cache[path]

    root = rows(())
    for gamma, top_k, total in [(3, 2, 4), (4, 3, 7), (5, 2, 9), (2, 4, 30)]:
        tree = grow_tree(root, TableStep(rows), gamma, top_k, total)
        assert _paths(tree) == _brute_force(root, rows, gamma, top_k, total), (gamma, top_k, total)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="gamma, top_k and total_tokens must be >= 1, got 0, 2, 3"):
        grow_tree(torch.zeros(V), lambda *a: None, 0, 2, 3)


def test_expand_scores_are_cumulative():
    tokens, parents, scores, ranks = expand(torch.tensor([4, 7]), torch.tensor([-1.0, -2.0]),
                                     torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)],
                                                   [math.log(0.1), math.log(0.2), math.log(0.7)]]), 2)
    assert tokens.tolist() == [0, 1, 2, 1]
    assert parents.tolist() == [4, 4, 7, 7]
    assert ranks.tolist() == [0, 1, 0, 1]
    assert scores.tolist() == pytest.approx([-1 + math.log(0.5), -1 + math.log(0.25),
                                             -2 + math.log(0.7), -2 + math.log(0.2)])


def test_select_tree_keeps_earlier_siblings_of_a_kept_later_one():
    # the root's third-drawn child (index 2) outscores the second: keeping it keeps the second too (a draw-order
    # prefix), so the conditional q of the third stays the one it was drawn from
    candidates = Candidates(torch.tensor([3, 1, 4]), torch.tensor([-1, -1, -1]), torch.tensor([-0.1, -3.0, -0.2]),
                            torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long))
    tree = select_tree(candidates, 2)
    assert tree.tokens.tolist() == [3, 1, 4]
    assert tree.ranks.tolist() == [0, 1, 2] and is_draw_prefix(tree)


def test_is_draw_prefix_refuses_a_gap_or_a_reordering():
    def tree(parents, ranks):
        n = len(parents)
        return DraftTree(torch.arange(n), torch.tensor(parents), torch.zeros(n), torch.tensor(ranks),
                         torch.zeros(n, dtype=torch.long), [])

    assert is_draw_prefix(tree([-1, -1, 0, 0, 1], [0, 1, 0, 1, 0]))
    assert not is_draw_prefix(tree([-1, -1, 0], [0, 2, 0]))  # the root's second draw dropped, the third kept
    assert not is_draw_prefix(tree([-1, -1], [1, 0]))  # kept, but out of draw order
    assert not is_draw_prefix(tree([-1, 0], [0, 1]))  # a first child of node 0 with rank 1


def test_expand_sampled_draws_distinct_children_with_slot_scores():
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    tokens, parents, scores, ranks = expand_sampled(torch.tensor([2, 5]), torch.tensor([-1.0, -2.0]), q, 3, gen)
    assert parents.tolist() == [2, 2, 2, 5]  # the second row's support has one token: one child
    assert ranks.tolist() == [0, 1, 2, 0]
    assert sorted(tokens[:3].tolist()) == [0, 1, 2] and tokens[3].item() == 2
    # the j-th child's score is the parent's plus the log of the j-th largest q, whatever token was drawn
    assert scores.tolist() == pytest.approx([-1 + math.log(0.5), -1 + math.log(0.3), -1 + math.log(0.2), -2.0])


def test_expand_sampled_draws_in_sequential_order():
    """First draw ~ q, second ~ q with the first zeroed: the joint law of the first two draws, exactly."""
    q = torch.tensor([0.5, 0.3, 0.15, 0.05])
    gen = torch.Generator().manual_seed(1)
    n = 40000
    counts = torch.zeros(4, 4)
    for _ in range(n // 100):
        rows = q.expand(100, 4)
        draws = torch.multinomial(rows, 2, replacement=False, generator=gen)  # what expand_sampled calls per row
        counts.index_put_((draws[:, 0], draws[:, 1]), torch.ones(100), accumulate=True)
    first, second = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    law = torch.where(first == second, 0.0, q[first] * q[second] / (1 - q[first]))
    mask = law > 0
    chi2 = (((counts - n * law)[mask]) ** 2 / (n * law[mask])).sum().item()
    assert chi2 < 32.9  # chi-square, 11 degrees of freedom, p = 0.0005
    # expand_sampled's own draw: same generator state, same tokens in the same order
    a = torch.multinomial(q, 3, replacement=False, generator=torch.Generator().manual_seed(7))
    b, *_ = expand_sampled(torch.tensor([-1]), torch.zeros(1), q[None], 3, torch.Generator().manual_seed(7))
    assert a.tolist() == b.tolist()


def test_sibling_q_zeroes_the_earlier_siblings():
    rows = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = sibling_q(torch.tensor([1, 0, 0, 2]), torch.tensor([-1, -1, 0, 0]), rows)
    expected = torch.tensor([[0.5, 0.3, 0.2], [0.5 / 0.7, 0.0, 0.2 / 0.7], [0.5, 0.3, 0.2],
                             [0.0, 0.1 / 0.9, 0.8 / 0.9]],
                            dtype=torch.float64)
    assert torch.allclose(q, expected)


@pytest.mark.parametrize("seed", range(20))
def test_sampled_growth_keeps_draw_order_prefixes_and_reports_their_rows(seed):
    """Random sharp rows, tight budgets: the kept children of every node are ranks 0, 1, ... of its draws, each
    node's row is the one its parent was expanded with, and tokens never repeat under one parent."""
    gen = torch.Generator().manual_seed(seed)
    cache = {}

    def rows(path):
        if path not in cache:
            cache[path] = torch.softmax(3 * torch.randn(V, generator=gen, dtype=torch.float64), -1).float()
        return cache[path]

    step = TableStep(rows)
    draw = torch.Generator().manual_seed(100 + seed)
    top_k, total = 3, 2 + seed % 7

    def expand_fn(nodes, scores, q):
        return expand_sampled(nodes, scores, q, top_k, draw)

    tree = grow_tree(rows(()), step, 4, top_k, total, expand_fn)
    assert is_draw_prefix(tree)
    assert len(tree.tokens) >= total or len(step.calls) < 3
    paths = _paths(tree)
    assert len(set(paths)) == len(paths)
    drawn_from = torch.cat(tree.expanded)[tree.rows]
    for i, path in enumerate(paths):
        assert torch.equal(drawn_from[i], rows(path[:-1]))
    assert torch.all(tree.scores[1:][tree.parents[1:] == tree.parents[:-1]] <=
                     tree.scores[:-1][tree.parents[1:] == tree.parents[:-1]])
