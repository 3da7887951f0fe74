"""Side rows: fed with a draft, invisible to it, never committed, their logits handed back to the drafter."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.drafter import BaseDrafter
from specfamily.core.side_rows import SideRows, side_visibility
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.testing import tiny_target

TREE = [-1, -1, 0, 1]
SIDE_PARENTS = [-1, 0, 0, -1]  # a small tree of guesses: rows 1 and 2 see row 0, row 3 only itself
PROMPT = [1, 2, 3, 4, 5]


def side_rows(tokens=(6, 7, 1, 2)) -> SideRows:
    return SideRows.branches(list(tokens), SIDE_PARENTS)


def test_side_rows_are_checked():
    with pytest.raises(ValueError, match=r"^side rows have 2 tokens but 1 depths$"):
        SideRows([1, 2], [1], torch.eye(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^side row depths must be >= 1"):
        SideRows([1, 2], [0, 1], torch.eye(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^side rows' visible mask must let every side row see itself$"):
        SideRows([1, 2], [1, 2], torch.tensor([[True, False], [True, False]]))
    with pytest.raises(ValueError, match=r"^a side row may see only itself and earlier side rows"):
        SideRows([1, 2], [1, 2], torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^side rows need at least one token"):
        SideRows([], [], torch.zeros(0, 0, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"^draft side rows must be a SideRows or None, got list$"):
        Draft([1], [-1], side=[1])


def test_verification_rows_and_side_rows_never_see_each_other():
    m, n, side = 2, len(TREE), side_rows()
    visible = side_visibility(m, TREE, side)
    assert not visible[: m + n, m + n :].any()  # no pending token or draft node sees a side row
    assert not visible[m + n :, m : m + n].any()  # no side row sees a draft node
    assert visible[m + n :, :m].all()  # every side row sees the committed prefix
    assert torch.equal(visible[m + n :, m + n :], side.visible)
    assert side.depths.tolist() == [1, 2, 2, 1]


def _pass(target, pending, draft):
    out = target.forward(torch.tensor(pending), draft)
    return out


def test_a_pass_with_side_rows_scores_the_draft_as_without_them_and_the_side_rows_as_a_tree():
    target = tiny_target()
    tokens = [3, 1, 4, 1]
    plain = _pass(target, PROMPT, Draft(tokens, TREE))
    target.commit([0, 2])
    after_plain = [layer.keys.clone() for layer in target.cache.layers]
    target.reset()
    side = side_rows()
    with_side = _pass(target, PROMPT, Draft(tokens, TREE, side=side))
    assert with_side.logits.shape == plain.logits.shape and with_side.side_logits.shape == (4, target.vocab_size)
    torch.testing.assert_close(with_side.logits, plain.logits, rtol=0, atol=1e-12)
    target.commit([0, 2])
    assert target.cached_length == len(PROMPT) + 2
    for kept, reference in zip(target.cache.layers, after_plain, strict=True):
        assert kept.keys.shape == reference.shape
        torch.testing.assert_close(kept.keys, reference, rtol=0, atol=1e-12)
    target.reset()  # the side rows are what the same tokens as a draft tree get
    as_tree = _pass(target, PROMPT, Draft(side.tokens, SIDE_PARENTS))
    torch.testing.assert_close(with_side.side_logits, as_tree.logits[1:], rtol=0, atol=1e-12)
    target.commit([])


def test_side_rows_on_an_empty_draft_leave_only_the_pending_tokens_cached():
    target = tiny_target()
    out = _pass(target, PROMPT, Draft([], [], side=side_rows()))
    assert out.logits.shape == (1, target.vocab_size) and out.side_logits.shape == (4, target.vocab_size)
    target.commit([])
    assert target.cached_length == len(PROMPT)
    assert all(layer.keys.shape[2] == len(PROMPT) for layer in target.cache.layers)


def test_a_draft_without_side_rows_returns_no_side_logits():
    target = tiny_target()
    assert _pass(target, PROMPT, Draft.chain([1, 2])).side_logits is None


class SideReader(BaseDrafter):
    """Proposes a fixed chain and a fixed side tree each pass; records the side logits it gets back."""

    def __init__(self) -> None:
        super().__init__(2, "constant")
        self.seen: list[torch.Tensor | None] = []

    def propose(self, ctx, gamma):
        return Draft.chain([ctx.tokens[-1]] * gamma, side=side_rows((ctx.tokens[-1], 1, 2, 3)))

    def observe(self, outcome: VerifyOutcome) -> None:
        self.seen.append(outcome.side_logits)


def test_the_loop_hands_side_logits_back_and_keeps_greedy_text():
    target = tiny_target()
    plain = sf.generate(target, None, PROMPT, max_new_tokens=12)
    drafter = SideReader()
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=12)
    assert result.tokens == plain.tokens
    assert drafter.seen and all(s is not None and s.shape == (4, target.vocab_size) for s in drafter.seen)
    assert result.metrics.target_passes == len(drafter.seen) + 1  # every pass but the last one is observed


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_features_cover_the_verified_rows_only(family):
    target = tiny_target(family)
    plain = target.forward(torch.tensor(PROMPT), Draft.chain([1, 2]), features=True)
    target.commit([])
    target.reset()
    with_side = target.forward(torch.tensor(PROMPT), Draft.chain([1, 2], side=side_rows()), features=True)
    target.commit([])
    assert with_side.features.shape == plain.features.shape == (len(PROMPT) + 2, target.hidden_size)
    torch.testing.assert_close(with_side.features, plain.features, rtol=0, atol=1e-12)
    torch.testing.assert_close(with_side.logits, plain.logits, rtol=0, atol=1e-12)
