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
from specfamily.core.top_p_head import threshold_head
from specfamily.core.types import SamplingConfig


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
    assert fallbacks == []


def test_a_flat_row_of_a_small_vocabulary_is_sorted_whole(monkeypatch):
    probs = torch.softmax(0.1 * torch.randn(1, 4096, generator=torch.Generator().manual_seed(1)), dim=-1)
    values, indices, keep = threshold_head(probs[0], 0.9)
    assert values.numel() == 4096  # every token is within 2^-16 of the maximum: at most MOST, sorted at once
    fallbacks = _fallbacks(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert fallbacks == []


def test_a_flat_row_falls_back_to_the_topk_path(monkeypatch):
    probs = torch.softmax(0.1 * torch.randn(2, 8192, generator=torch.Generator().manual_seed(1)), dim=-1)
    assert threshold_head(probs[0], 0.9) is None  # more than MOST tokens within 2^-16 of the maximum
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
    assert sum(fallbacks) < 10 * 200  # most rows of each top_p settled by the threshold head


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
    assert threshold_head(probs, top_p) is None  # then the topk path decides (tests/core/test_sampling_top_p.py)


@pytest.mark.parametrize("vocab", [64, 100, 4097])
def test_rows_whose_length_is_not_a_multiple_of_the_block_are_not_tried(vocab):
    probs = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)), dim=-1)
    assert (threshold_head(probs, 0.5) is None) == (vocab % top_p_head.BLOCK != 0)


def test_a_nan_row_is_left_to_the_topk_path():
    probs = torch.full((128,), float("nan"))
    assert threshold_head(probs, 0.9) is None


def test_warp_at_smollm2s_vocabulary_matches_the_full_sort(monkeypatch):
    logits = 4 * torch.randn(8, 49152, generator=torch.Generator().manual_seed(5))
    fallbacks = _fallbacks(monkeypatch)
    for config in (SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=50, top_p=0.95)):
        scaled = torch.softmax(sampling.top_k_filter(logits / config.temperature, config.top_k), dim=-1)
        assert torch.equal(warp(logits, config), _full_sort(scaled, config.top_p))
        assert all(torch.equal(warp(logits[i : i + 1], config)[0], warp(logits, config)[i]) for i in range(8))
    assert fallbacks == []
