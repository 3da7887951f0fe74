"""The threshold head (specfamily.core.top_p_head) keeps exactly what a full descending sort keeps, and the warp's
rows it settles are the full sort's rows bit for bit.

Every test counts the rows the bounded ``topk`` path (``sampling.descending``) had to take, so that a test of the
threshold head cannot pass on the fallback alone.
"""

from __future__ import annotations

import pytest
import torch
from test_sampling_top_p import _full_sort

from specfamily.core import sampling, top_p_head
from specfamily.core.sampling import top_p_filter, top_p_keep, warp
from specfamily.core.top_p_head import threshold_head, threshold_heads
from specfamily.core.types import SamplingConfig
from specfamily.testing.tiny import single_thread


def _settles(row: torch.Tensor, top_p: float) -> bool:
    """Whether one row's threshold head settles it, alone (threshold_head) and as a batch of one (threshold_heads,
    whose second, lower threshold may settle what the first does not)."""
    alone, batch = threshold_head(row.view(1, -1), top_p), threshold_heads(row.view(1, -1), top_p)
    assert alone is None or (batch is not None and batch.settled.tolist() == [0])
    return batch is not None and batch.settled.tolist() == [0]


def _equal_row_by_row(probs: torch.Tensor, top_p: float) -> bool:
    """top_p_filter of each row alone (the single-row head) is the full sort's row."""
    return all(torch.equal(top_p_filter(probs[i : i + 1], top_p), _full_sort(probs[i : i + 1], top_p))
               for i in range(probs.shape[0]))


def _fallbacks(monkeypatch) -> list[int]:
    """Rows handed to the topk path, per call of ``descending``."""
    rows, real = [], sampling.descending

    def recording(probs, k):
        rows.append(probs.shape[0])
        return real(probs, k)

    monkeypatch.setattr(sampling, "descending", recording)
    return rows


def test_peaked_rows_settle_without_topk(monkeypatch):
    probs = torch.softmax(6 * torch.randn(20, 4096, generator=torch.Generator().manual_seed(0)), dim=-1)
    fallbacks = _fallbacks(monkeypatch)
    for top_p in (0.3, 0.9, 0.95):
        assert torch.equal(top_p_filter(probs, top_p), _full_sort(probs, top_p))
        assert torch.equal(top_p_keep(probs, top_p), _full_sort(probs, top_p) > 0)
        assert _equal_row_by_row(probs, top_p)
    assert fallbacks == []


def test_a_flat_row_of_a_small_vocabulary_is_sorted_whole(monkeypatch):
    probs = torch.softmax(0.1 * torch.randn(1, 4096, generator=torch.Generator().manual_seed(1)), dim=-1)
    heads = threshold_heads(probs, 0.9)
    assert heads.token.numel() == 4096  # every token is within 2^-16 of the maximum: at most MOST, sorted at once
    fallbacks = _fallbacks(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert fallbacks == []


def test_a_flat_row_falls_back_to_the_topk_path(monkeypatch):
    probs = torch.softmax(0.1 * torch.randn(2, 8192, generator=torch.Generator().manual_seed(1)), dim=-1)
    assert not _settles(probs[0], 0.9)  # more than MOST tokens within 2^-16 of the maximum
    fallbacks = _fallbacks(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert fallbacks[0] == 2


def test_a_batch_of_settled_and_flat_rows(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    scales = torch.tensor([8.0, 0.1, 3.0, 1.0, 0.05]).view(-1, 1)
    probs = torch.softmax(scales * torch.randn(5, 8192, generator=gen), dim=-1)
    fallbacks = _fallbacks(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert fallbacks[0] == 3  # the three flatter rows (scales 0.1, 1, 0.05); the peaked two settled by their heads


def test_ties_at_the_crossing_keep_the_first_tokens_in_token_order(monkeypatch):
    probs = torch.zeros(1, 128)
    probs[0, [100, 3, 64, 10]] = torch.tensor([0.4, 0.2, 0.2, 0.2])
    fallbacks = _fallbacks(monkeypatch)
    got = top_p_filter(probs, 0.7)
    assert torch.equal(got, _full_sort(probs, 0.7))
    assert (got[0] > 0).nonzero().view(-1).tolist() == [3, 10, 100]  # the two tied ones lowest in token order
    assert fallbacks == []


def test_many_ties_against_the_full_sort(monkeypatch):
    logits = torch.randint(-3, 4, (200, 256), generator=torch.Generator().manual_seed(3)).float()
    probs = torch.softmax(2 * logits, dim=-1)
    fallbacks = _fallbacks(monkeypatch)
    for top_p in (0.2, 0.5, 0.8, 0.9):
        assert torch.equal(top_p_filter(probs, top_p), _full_sort(probs, top_p))
        assert _equal_row_by_row(probs[:50], top_p)
    assert fallbacks == []  # every row settled by its threshold head, in the batch and alone


def test_exact_boundaries_stop_there_as_the_full_sort_does(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    fallbacks = _fallbacks(monkeypatch)
    for _ in range(200):
        probs = torch.softmax(3 * torch.randn(1, 512, generator=gen), dim=-1)
        j = int(torch.randint(1, 12, (1,), generator=gen))
        ranked = probs.sort(descending=True).values[0]
        top_p = float(ranked.cumsum(0)[j] - ranked[j])
        got = top_p_filter(probs, top_p)
        assert torch.equal(got, _full_sort(probs, top_p))
        assert int((got > 0).sum()) == j
    assert len(fallbacks) < 100


def test_a_head_whose_mass_passes_top_p_by_less_than_the_rounding_margin_is_not_settled():
    big = torch.linspace(0.02, 0.01, 63, dtype=torch.float64)
    probs = torch.cat([big, torch.full((65,), 1e-9, dtype=torch.float64)]).float()
    top_p = float(probs[:63].cumsum(0)[-1])
    assert not _settles(probs, top_p)  # then the topk path decides (tests/core/test_sampling_top_p.py)


@pytest.mark.parametrize("vocab", [64, 100, 4097])
def test_rows_whose_length_is_not_a_multiple_of_the_block_are_not_tried(vocab):
    probs = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)), dim=-1)
    assert _settles(probs, 0.5) == (vocab % top_p_head.BLOCK == 0)
    assert (threshold_heads(probs.view(1, -1), 0.5) is None) == (vocab % top_p_head.BLOCK != 0)


def test_a_nan_row_is_left_to_the_topk_path():
    probs = torch.full((128,), float("nan"))
    assert not _settles(probs, 0.9)


def test_warp_at_smollm2s_vocabulary_matches_the_full_sort(monkeypatch):
    logits = 4 * torch.randn(8, 49152, generator=torch.Generator().manual_seed(5))
    fallbacks = _fallbacks(monkeypatch)
    for config in (SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=50, top_p=0.95)):
        scaled = torch.softmax(sampling.top_k_filter(logits / config.temperature, config.top_k), dim=-1)
        assert torch.equal(warp(logits, config), _full_sort(scaled, config.top_p))
        with single_thread():  # a lone row's reductions split across threads otherwise
            assert all(torch.equal(warp(logits[i : i + 1], config)[0], warp(logits, config)[i]) for i in range(8))
    assert fallbacks == []


def test_rows_that_need_the_second_threshold_in_a_batch(monkeypatch):
    """Row 1's head within 2^-8 of its maximum holds 0.5 < top_p; within 2^-16 it holds all its mass: the second
    threshold settles it, beside rows the first settles (the second pass maps its rows back into the batch)."""
    probs = torch.softmax(6 * torch.randn(3, 1024, generator=torch.Generator().manual_seed(7)), dim=-1)
    probs[1] = 0.0
    probs[1, 700] = 0.5
    probs[1, 3:503] = 0.001  # 2^-9 of the maximum each
    heads = threshold_heads(probs, 0.9)
    assert sorted(heads.settled.tolist()) == [0, 1, 2] and int((heads.row == 1).sum()) == 501
    fallbacks = _fallbacks(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert fallbacks == []


def test_a_strided_batch_is_read_as_its_values():
    """Rows that are not contiguous (every other row of a batch, a column-major matrix) give the full sort's result on
    their values (the full sort of a column-major matrix sums its rows in another order: the same kept set, sums
    that may differ in the last place)."""
    probs = torch.softmax(5 * torch.randn(8, 1024, generator=torch.Generator().manual_seed(8)), dim=-1)
    for strided in (probs[::2], probs.t().contiguous().t()):
        assert not strided.is_contiguous()
        assert torch.equal(top_p_filter(strided, 0.9), _full_sort(strided.contiguous(), 0.9))
        assert torch.equal(top_p_keep(strided, 0.9), _full_sort(strided, 0.9) > 0)
        assert torch.equal(top_p_filter(strided[:1], 0.9), _full_sort(strided[:1].contiguous(), 0.9))
