"""Feature drafting's sampled trees (EAGLE / EAGLE-3, ``tree_sampling="sampled"``): what a draft reports, the
draw-order prefix it must keep, the option's checks and greedy equality. Losslessness at depth 3 under the three
sampling configs: tests/testing/test_registered_drafters.py."""

import pytest
import torch

import specfamily as sf
from specfamily.drafters.eagle.config import Eagle3Config, EagleConfig
from specfamily.drafters.shared.dynamic_tree import DraftTree
from specfamily.drafters.shared.feature_drafting import drawn_q
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless


def _recording(name: str, drafts: list, **options):
    def factory(target):
        drafter = sf.create_drafter(name, target, weights="random", gamma=3, top_k=3, total_tokens=10, **options)
        propose = drafter.propose

        def recording(ctx, gamma):
            draft = propose(ctx, gamma)
            drafts.append((draft, ctx.sampling))
            return draft

        drafter.propose = recording
        return drafter

    return factory


def _check_conditional_q(draft) -> None:
    """Rows are distributions; a node's q is zero at its earlier siblings' tokens and positive at its own."""
    q, tokens, parents = draft.q, draft.tokens.tolist(), draft.parents.tolist()
    assert q.shape == (len(tokens), 8)
    assert torch.allclose(q.sum(dim=-1), torch.ones(len(tokens)), atol=1e-5)
    for i, (token, parent) in enumerate(zip(tokens, parents, strict=True)):
        earlier = [tokens[j] for j in range(i) if parents[j] == parent]
        assert token not in earlier  # drawn without replacement
        assert q[i, token] > 0 and all(q[i, t] == 0 for t in earlier)


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_sampled_trees_report_each_childs_conditional_q(name):
    drafts: list = []
    assert_lossless(_recording(name, drafts, tree_sampling="sampled"), configs=SAMPLING_MATRIX[1:2], samples=200,
                    min_depth=0)
    trees = [draft for draft, _ in drafts if len(draft) and not draft.is_chain]
    assert len(trees) > 100
    siblings = 0
    for draft in trees:
        _check_conditional_q(draft)
        siblings += int((draft.parents[1:] == draft.parents[:-1]).sum())
    assert siblings > len(trees)  # the check above met later siblings, whose q differs from the first's


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_topk_trees_stay_deterministic_under_sampling(name):
    drafts: list = []
    assert_lossless(_recording(name, drafts, tree_sampling="topk"), configs=SAMPLING_MATRIX[1:2], samples=100,
                    min_depth=0)
    drafted = [draft for draft, _ in drafts if len(draft)]
    assert drafted and all(draft.q is None for draft in drafted)


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_greedy_sampled_trees_are_top_k_and_equal_plain_decoding(name):
    drafts: list = []
    reports = assert_greedy_equivalent(_recording(name, drafts, tree_sampling="sampled"))
    assert all(report.proposed_tokens > 0 and report.depth.deepest_drafted >= 2 for report in reports)
    drafted = [draft for draft, sampling in drafts if len(draft)]
    assert drafted and all(draft.q is None and not draft.is_chain for draft in drafted)
    assert all(sampling.greedy for _, sampling in drafts)


def test_a_tree_whose_kept_siblings_skip_a_draw_is_refused():
    q = torch.full((1, 4), 0.25)
    tree = DraftTree(torch.tensor([1, 2]), torch.tensor([-1, -1]), torch.zeros(2), torch.tensor([0, 2]),
                     torch.zeros(2, dtype=torch.long), [q])
    with pytest.raises(RuntimeError, match="a sampled tree kept a later-drawn sibling without an earlier one"):
        drawn_q(tree)
    tree.ranks = torch.tensor([0, 1])
    assert drawn_q(tree).tolist() == [[0.25] * 4, [1 / 3, 0.0, 1 / 3, 1 / 3]]


@pytest.mark.parametrize(("config", "name"), [(EagleConfig, "eagle"), (Eagle3Config, "eagle3")])
def test_tree_sampling_is_checked(config, name):
    with pytest.raises(ValueError, match=rf"{name} tree_sampling must be one of \('topk', 'sampled'\), got 'greedy'"):
        config(weights="random", tree_sampling="greedy")
    assert config(weights="random", tree_sampling="sampled").tree_sampling == "sampled"
