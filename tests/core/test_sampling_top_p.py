"""Top-p over a bounded head (``torch.topk``, widened when needed) keeps exactly what a full descending sort keeps.

``_full_sort`` is the top-p the warp had before: every row sorted over the whole vocabulary. The head version must
give the same tensor, bit for bit, on rows that settle in the first head, rows that need it widened (once, or up to
the whole vocabulary), a vocabulary smaller than the head, ties at the crossing and at the head's edge, exact
boundaries, and batches whose rows need different widths.
"""

from __future__ import annotations

import pytest
import torch

from specfamily.core import sampling
from specfamily.core.sampling import top_p_filter, top_p_keep, warp
from specfamily.core.types import SamplingConfig
from specfamily.testing.law import reference_warp
from specfamily.testing.tiny import single_thread


def _full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The full-vocabulary top-p, as the warp did it before the head (ties in token order)."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    keep_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) < top_p
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def _widths(monkeypatch) -> list[int]:
    """Record the head width of every ``descending`` call."""
    seen, real = [], sampling.descending

    def recording(probs, k):
        seen.append(k)
        return real(probs, k)

    monkeypatch.setattr(sampling, "descending", recording)
    return seen


def test_a_peaked_row_settles_in_the_first_head(monkeypatch):
    probs = torch.softmax(8 * torch.randn(3, 5000, generator=torch.Generator().manual_seed(0)), dim=-1)
    seen = _widths(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert seen == [sampling.TOP_P_START]


def test_a_flat_row_widens_until_its_mass_is_reached(monkeypatch):
    probs = torch.softmax(0.1 * torch.randn(1, 5000, generator=torch.Generator().manual_seed(1)), dim=-1)
    seen = _widths(monkeypatch)
    assert torch.equal(top_p_filter(probs, 0.9), _full_sort(probs, 0.9))
    assert seen == [64, 256, 1024, 4096, 5000]  # up to the whole row, sorted then
    assert (top_p_filter(probs, 0.9) > 0).sum() > 1024


def test_batched_rows_widen_only_as_far_as_each_needs(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    scales = torch.tensor([8.0, 0.1, 3.0, 1.0]).view(-1, 1)  # peaked, flat, in between
    probs = torch.softmax(scales * torch.randn(4, 3000, generator=gen), dim=-1)
    seen = _widths(monkeypatch)
    for top_p in (0.3, 0.9, 0.95):
        seen.clear()
        assert torch.equal(top_p_filter(probs, top_p), _full_sort(probs, top_p))
        assert len(seen) > 1
    keep = top_p_keep(probs, 0.9)
    assert keep.sum(-1).tolist() == (_full_sort(probs, 0.9) > 0).sum(-1).tolist()


@pytest.mark.parametrize("vocab", [1, 2, 7, 63, 64, 65])
def test_a_vocabulary_smaller_than_the_head(vocab):
    probs = torch.softmax(2 * torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab)), dim=-1)
    for top_p in (0.1, 0.5, 0.9, 0.999):
        assert torch.equal(top_p_filter(probs, top_p), _full_sort(probs, top_p))


def test_ties_at_the_crossing_keep_the_first_tokens_in_token_order():
    # 0.4 then three tokens of 0.2: top_p 0.7 keeps the 0.4 and two of the tied ones, the lowest in token order
    probs = torch.tensor([[0.2, 0.4, 0.2, 0.2]])
    assert (top_p_filter(probs, 0.7) > 0).tolist() == [[True, True, True, False]]
    assert torch.equal(top_p_filter(probs, 0.7), _full_sort(probs, 0.7))


def test_ties_across_the_heads_edge_widen_it(monkeypatch):
    # a head of 4 cuts a run of 6 tied tokens; top_p keeps some of them: the head must widen to see them all
    probs = torch.tensor([[0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1]])
    seen = _widths(monkeypatch)
    expected = _full_sort(probs, 0.45)
    assert torch.equal(top_p_filter(probs, 0.45, start=4), expected)
    assert seen[0] == 4 and len(seen) > 1
    assert (expected > 0).nonzero()[:, 1].tolist() == [1, 2, 7]  # the tied ones kept in token order


def test_many_ties_against_the_full_sort():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(-3, 4, (300, 200), generator=gen).float()  # many tied probabilities
    probs = torch.softmax(logits, dim=-1)
    for top_p in (0.2, 0.5, 0.8, 0.9):
        for start in (1, 4, 16, 64):
            assert torch.equal(top_p_filter(probs, top_p, start=start), _full_sort(probs, top_p))


def test_exact_boundaries_stop_there_as_the_full_sort_does():
    # top_p equal to the float32 mass of the first j tokens: exactly j kept, both ways, from any head width
    gen = torch.Generator().manual_seed(4)
    for _ in range(300):
        probs = torch.softmax(2 * torch.randn(1, 300, generator=gen), dim=-1)
        j = int(torch.randint(1, 40, (1,), generator=gen))
        ranked = probs.sort(descending=True).values[0]
        top_p = float(ranked.cumsum(0)[j] - ranked[j])
        for start in (2, 16, 64):
            got = top_p_filter(probs, top_p, start=start)
            assert torch.equal(got, _full_sort(probs, top_p))
            assert int((got > 0).sum()) == j


def test_a_head_whose_mass_passes_top_p_by_less_than_the_rounding_margin_widens(monkeypatch):
    # 63 tokens hold top_p; the 64th, the head's last, adds 1e-9: its mass before is top_p (not kept), but the head's
    # mass is within float rounding of top_p, so the head does not settle the row and the next width is read
    big = torch.linspace(0.02, 0.01, 63, dtype=torch.float64)
    probs = torch.cat([big, torch.full((65,), 1e-9, dtype=torch.float64)]).float().view(1, -1)
    top_p = float(probs[0, :63].cumsum(0)[-1])
    seen = _widths(monkeypatch)
    got = top_p_filter(probs, top_p)
    assert torch.equal(got, _full_sort(probs, top_p)) and int((got > 0).sum()) == 63
    assert seen == [64, 128]


@pytest.mark.parametrize("config", [SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=5, top_p=0.95),
                                    SamplingConfig(1.3, top_k=100, top_p=0.8), SamplingConfig(0.5, top_p=0.5)])
def test_warp_at_a_large_vocabulary_matches_the_full_sort_and_the_law(config):
    logits = 4 * torch.randn(6, 49152, generator=torch.Generator().manual_seed(5))
    scaled = torch.softmax(sampling.top_k_filter(logits / config.temperature, config.top_k), dim=-1)
    got = warp(logits, config)
    assert torch.equal(got, _full_sort(scaled, config.top_p))
    law = reference_warp(logits, config)
    assert torch.equal(got > 0, law > 0) and torch.allclose(got.double(), law, atol=1e-6)


def test_one_row_warped_alone_is_its_row_of_the_batch():
    """What the verifier relies on to warp only the rows it reads: a row's warp does not depend on the others, bit
    for bit at one thread (as the suite's workers run). At more threads ATen splits a lone row's reductions across
    threads while a batch's rows go one a thread, so the last bits may differ: the same law either way."""
    logits = 3 * torch.randn(13, 49152, generator=torch.Generator().manual_seed(6))
    with single_thread():
        for config in (SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=20), SamplingConfig(1.0)):
            batch = warp(logits, config)
            assert all(torch.equal(warp(logits[i : i + 1], config)[0], batch[i]) for i in range(13))
