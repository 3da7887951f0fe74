"""Reduced draft vocabularies: the most frequent ids, the d2t map, head rows and zero-padded q."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specfamily.drafters.shared.draft_vocab import DraftVocab, coverage, frequent_tokens


def test_the_most_frequent_ids_in_ascending_order_ties_to_the_lower_id():
    tokens = np.array([5, 5, 5, 2, 2, 9, 9, 7, 1])
    vocab = frequent_tokens(tokens, 3, 10)
    assert vocab.ids.tolist() == [2, 5, 9]  # 9 and 2 twice, 7 and 1 once: the tie 2 / 9 both in, 5 first
    assert frequent_tokens(tokens, 4, 10).ids.tolist() == [1, 2, 5, 9]


def test_counts_are_kept_and_a_vocabulary_restricts_to_its_most_counted():
    vocab = frequent_tokens(np.array([5, 5, 5, 2, 2, 9, 9, 7, 1]), 4, 10)
    assert vocab.counts.tolist() == [1, 2, 3, 2]  # ids 1, 2, 5, 9
    assert vocab.restrict(2).ids.tolist() == [2, 5] and vocab.restrict(2).counts.tolist() == [2, 3]
    with pytest.raises(ValueError, match="needs 1..4 tokens, got 5"):
        vocab.restrict(5)
    with pytest.raises(ValueError, match="no counts"):
        DraftVocab(torch.tensor([1, 2]), 8).restrict(1)


def test_always_included_ids_displace_the_least_frequent():
    vocab = frequent_tokens(np.array([5, 5, 5, 2, 2, 9]), 2, 10, always=(0,))
    assert vocab.ids.tolist() == [0, 5]


def test_map_rows_and_q():
    vocab = DraftVocab(torch.tensor([1, 4, 6]), 8)
    assert vocab.to_target(torch.tensor([[2, 0]])).tolist() == [[6, 1]]
    weight = torch.arange(16.0).view(8, 2)
    assert torch.equal(vocab.head_weight(weight), weight[[1, 4, 6]])
    q = torch.tensor([[0.5, 0.25, 0.25]])
    full = vocab.full_q(q)
    assert full.shape == (1, 8) and full[0, [1, 4, 6]].tolist() == [0.5, 0.25, 0.25] and float(full.sum()) == 1.0
    assert vocab.full_q(q[0]).shape == (8,)
    assert coverage(np.array([1, 1, 2, 6]), vocab) == 0.75


@pytest.mark.parametrize(("ids", "message"), [
    (torch.tensor([3, 1]), "strictly increasing"),
    (torch.tensor([1, 1]), "strictly increasing"),
    (torch.tensor([1, 8]), r"must lie in \[0, 8\), got 1..8"),
    (torch.tensor([], dtype=torch.long), "non-empty 1-d long tensor"),
    (torch.tensor([1.0, 2.0]), "non-empty 1-d long tensor"),
])
def test_bad_vocabularies_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        DraftVocab(ids, 8)


def test_sizes_and_out_of_range_tokens_are_refused():
    with pytest.raises(ValueError, match="a draft vocabulary needs 1..8 tokens, got 9"):
        frequent_tokens(np.array([1]), 9, 8)
    with pytest.raises(ValueError, match="token id 9 is outside the vocabulary of 8"):
        frequent_tokens(np.array([9]), 2, 8)
    with pytest.raises(ValueError, match="does not fit a draft vocabulary over 8 tokens"):
        DraftVocab(torch.tensor([1]), 8).head_weight(torch.zeros(6, 2))
