"""Lookahead decoding: the Jacobi window's side rows, the n-gram pool, greedy equality through the loop.

Losslessness under sampling (chain and tree, three settings) is in tests/testing/test_registered_drafters.py."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.side_rows import side_visibility
from specfamily.drafters.lookahead.config import LookaheadConfig
from specfamily.drafters.lookahead.pool import NgramPool, trie
from specfamily.drafters.lookahead.window import JacobiWindow, advance, window_rows
from specfamily.testing import assert_greedy_equivalent, tiny_target


def test_window_rows_follow_each_columns_trajectory():
    levels = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]  # W = 3, N - 1 = 3
    side = window_rows(levels)
    assert side.tokens.tolist() == [10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert side.depths.tolist() == [1, 2, 3, 2, 3, 4, 3, 4, 5]  # level l, column j at depth l + j + 1
    seen = {row: side.visible[row].nonzero().flatten().tolist() for row in range(9)}
    assert seen[2] == [0, 1, 2]  # level 0 is causal
    assert seen[4] == [0, 1, 4]  # level 1, column 1: level 0 up to column 1, then itself
    assert seen[8] == [0, 1, 2, 5, 8]  # level 2, column 2: level 0 up to column 2, column 2 of level 1, itself
    # in context order each row's visible tokens sit at depths 1, 2, ..., its own depth: a consistent sequence
    for row, visible in seen.items():
        assert side.depths[visible].tolist() == list(range(1, int(side.depths[row]) + 1))


def test_advance_warms_up_then_completes_one_ngram_per_column():
    window = JacobiWindow(width=2, depth=2, levels=[[1, 2]])
    logits = torch.zeros(2, 8)
    logits[0, 5], logits[1, 6] = 1.0, 1.0
    assert advance(window, logits) == [] and window.levels == [[1, 2], [5, 6]] and window.warm
    logits = torch.zeros(4, 8)
    logits[2, 3], logits[3, 4] = 1.0, 1.0  # the last level's rows
    assert advance(window, logits) == [(1, 5, 3), (2, 6, 4)]
    assert window.levels == [[5, 6], [3, 4]]


def test_the_pool_keeps_the_most_recent_continuations_and_cuts_at_a_stop_token():
    pool = NgramPool(capacity=2)
    for gram in [(1, 2, 3), (1, 4, 5), (1, 2, 3), (1, 6, 7)]:
        pool.add(gram)
    assert pool.candidates(1, 2, 4, frozenset()) == [[6, 7], [2, 3]]  # (1, 4, 5) evicted
    assert pool.candidates(1, 1, 4, frozenset()) == [[6], [2]]
    assert pool.candidates(1, 2, 1, frozenset({6})) == [[6]]
    assert pool.candidates(9, 2, 4, frozenset()) == []
    pool.add_text([1, 2, 3, 1, 2, 9], 3, start=2)
    assert pool.candidates(1, 2, 4, frozenset()) == [[2, 9], [6, 7]]  # only n-grams starting at or after 2


def test_trie_merges_shared_prefixes():
    assert trie([[1, 2, 3], [1, 2, 4], [5]]) == ([1, 2, 3, 4, 5], [-1, 0, 1, 1, -1])


def test_config_is_checked():
    with pytest.raises(ValueError, match=r"^ngram must be an integer >= 2, got 1$"):
        LookaheadConfig(ngram=1)
    with pytest.raises(ValueError, match=r"^guesses must be an integer >= 1, got 0$"):
        sf.create_drafter("lookahead", None, guesses=0)
    with pytest.raises(ValueError, match=r"^prompt_pool must be a boolean"):
        LookaheadConfig(prompt_pool="yes")


def test_every_pass_carries_the_window_and_its_guesses_stay_off_the_verified_rows():
    target = tiny_target()
    # its default length N - 1, pinned: at its defaults the batch-1 gate would stop a tiny model's side rows, dear
    # beside its cheap passes (tests/core/test_batch_gate.py); these tests are about the passes lookahead makes
    drafter = sf.create_drafter("lookahead", target, gamma=2, window=3, ngram=3, guesses=2)
    drafts = []
    propose = drafter.propose
    drafter.propose = lambda ctx, gamma: drafts.append(propose(ctx, gamma)) or drafts[-1]
    result = sf.generate(target, drafter, [1, 2, 3, 4], max_new_tokens=20)
    assert drafts and all(draft.side is not None for draft in drafts)
    assert {len(draft.side) for draft in drafts} == {3, 6}  # warming up (one level), then N - 1 = 2 levels
    for draft in drafts:
        visible = side_visibility(1, draft.parents, draft.side)
        assert not visible[: 1 + len(draft), 1 + len(draft) :].any()
    passes = result.metrics.target_passes
    assert len(drafts) in (passes, passes - 1)  # every pass but a last one left a single token (gamma 0)


@pytest.mark.parametrize("options", [{"guesses": 1, "window": 4, "ngram": 4}, {"guesses": 4, "window": 4, "ngram": 4},
                                     {"guesses": 4, "window": 4, "ngram": 4, "prompt_pool": False}, {}],
                         ids=["chain", "tree", "jacobi-pool-only", "defaults"])
def test_greedy_equals_plain_decoding(options):
    [llama, gpt2] = assert_greedy_equivalent(lambda target: sf.create_drafter("lookahead", target, **options))
    assert llama.drafted_passes > 0 and gpt2.drafted_passes > 0


def test_the_jacobi_pool_alone_gets_tokens_accepted():
    """Without prompt n-grams every candidate comes from the window's side rows: accepted tokens prove the side
    logits feed the pool."""
    target = tiny_target(vocab_size=16)
    drafter = sf.create_drafter("lookahead", target, gamma=3, prompt_pool=False, window=4, ngram=4, guesses=4)
    result = sf.generate(target, drafter, [1, 2, 3, 4, 5], max_new_tokens=48)
    assert result.tokens == sf.generate(target, None, [1, 2, 3, 4, 5], max_new_tokens=48).tokens
    assert result.metrics.target_passes < 48


def test_cpu_defaults_feed_two_side_rows_and_a_chain_of_at_most_two():
    target = tiny_target(vocab_size=16)
    defaults = sf.create_drafter("lookahead", target).config
    assert (defaults.window, defaults.ngram, defaults.guesses, defaults.gamma) == (1, 3, 1, None)  # gamma: N - 1
    drafter = sf.create_drafter("lookahead", target, gamma=2)  # N - 1 pinned (the gate: see above)
    shapes = []
    propose = drafter.propose

    def spy(ctx, gamma):
        draft = propose(ctx, gamma)
        shapes.append((len(draft.tokens), len(draft.side.tokens), draft.parents.tolist()))
        return draft

    drafter.propose = spy
    result = sf.generate(target, drafter, [1, 2, 3, 1, 2, 3, 1], max_new_tokens=24)
    assert result.tokens == sf.generate(target, None, [1, 2, 3, 1, 2, 3, 1], max_new_tokens=24).tokens
    assert shapes and all(side <= 2 and size <= 2 and parents == list(range(-1, size - 1))
                          for size, side, parents in shapes)
    assert shapes[0][1] == 1 and all(side == 2 for _, side, _ in shapes[1:])  # one level while warming up, then 2
    assert any(size == 2 for size, _, _ in shapes)  # a chain of N - 1 = 2 was proposed
