"""``warp`` against transformers' own TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper.

transformers applies them in this order (``GenerationMixin._get_logits_processor``: temperature, top-k, top-p) and
samples from the softmax of what they leave. On random logits the two agree: same support, same probabilities.
Where the specification is precise about edge cases (DESIGN.md, "Sampling"), it is tested as specified:

- ties at the k-th value: both keep every tied token (TopKLogitsWarper masks ``scores < kth``, as ``warp`` does);
- an exact top-p boundary (the first j tokens' mass *equals* top_p): the specification stops there ("until their
  mass reaches top_p"), and ``warp`` keeps exactly j tokens. transformers removes a token when its *ascending*
  cumulative sum is ``<= 1 - top_p``; that sum and ``1 - top_p`` round differently from the descending mass, so at
  such a boundary it keeps token j + 1 as well in about half the cases (249 of the 500 random ones below), never
  fewer tokens and never two more. On probabilities exact in binary (0.5, 0.25, ...) the two agree.
- tied probabilities at the top-p crossing: both keep the same number of tokens; which of the tied tokens is kept
  depends on each sort's order and is not specified.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specfamily.core.sampling import warp
from specfamily.core.types import SamplingConfig
from specfamily.testing.mutants import Hits, warp_gallery

TEMPERATURES = (0.3, 0.7, 1.0, 1.5)
TOP_KS = (0, 1, 5, 20, 50)
TOP_PS = (1.0, 0.3, 0.9, 0.95)


def hf_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """transformers' warpers in ``generate``'s order, then the softmax it samples from."""
    scores = logits.float()
    if sampling.temperature != 1.0:
        scores = TemperatureLogitsWarper(float(sampling.temperature))(None, scores)
    if sampling.top_k != 0:
        scores = TopKLogitsWarper(sampling.top_k)(None, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(sampling.top_p)(None, scores)
    return torch.softmax(scores, dim=-1)


def _configs() -> list[SamplingConfig]:
    return [SamplingConfig(t, top_k=k, top_p=p) for t, k, p in itertools.product(TEMPERATURES, TOP_KS, TOP_PS)]


def mismatches(warp_fn, logits: torch.Tensor) -> list[str]:
    """The configs under which ``warp_fn`` and transformers disagree on some row of ``logits`` (B, V)."""
    found = []
    for sampling in _configs():
        ours, theirs = warp_fn(logits, sampling), hf_warp(logits, sampling)
        if not torch.equal(ours > 0, theirs > 0) or not torch.allclose(ours, theirs, atol=1e-6):
            found.append(str(sampling))
    return found


def _random_logits(seed: int, scale: float = 3.0) -> torch.Tensor:
    return scale * torch.randn(200, 50, generator=torch.Generator().manual_seed(seed))


def test_warp_matches_transformers_on_random_logits():
    assert mismatches(warp, _random_logits(0)) == []


def test_top_k_keeps_every_tie_at_the_kth_value_as_transformers_does():
    logits = torch.randint(-3, 4, (500, 50), generator=torch.Generator().manual_seed(1)).float()  # many ties
    for k in (1, 3, 5, 20):
        sampling = SamplingConfig(1.0, top_k=k)
        ours = warp(logits, sampling)
        kth = logits.topk(k, dim=-1).values[:, -1:]
        assert torch.equal(ours > 0, logits >= kth)  # every token tied with the k-th kept
        assert bool(((ours > 0).sum(-1) > k).any())  # ties did widen the cut
        assert torch.equal(hf_warp(logits, sampling) > 0, ours > 0)
        assert torch.allclose(hf_warp(logits, sampling), ours, atol=1e-6)


def _boundary_cases(count: int) -> list[tuple[torch.Tensor, float, int]]:
    """(logits (1, V), top_p, j): top_p is exactly the mass of the j most probable tokens, as ``warp`` sums it."""
    gen, cases = torch.Generator().manual_seed(2), []
    for _ in range(count):
        logits = 2 * torch.randn(1, 8, generator=gen)
        j = int(torch.randint(1, 7, (1,), generator=gen))
        ranked = torch.softmax(logits.float(), dim=-1).sort(descending=True).values[0]
        mass = ranked.cumsum(0)[j] - ranked[j]  # the mass before token j, in warp's float32 arithmetic
        cases.append((logits, float(mass), j))
    return cases


def test_an_exact_top_p_boundary_stops_there_and_transformers_may_keep_one_more():
    extra = 0
    for logits, top_p, j in _boundary_cases(500):
        sampling = SamplingConfig(1.0, top_p=top_p)
        ours, theirs = warp(logits, sampling) > 0, hf_warp(logits, sampling) > 0
        order = logits[0].argsort(descending=True)
        assert ours[0, order[:j]].all() and not ours[0, order[j:]].any()  # the specification: exactly j tokens
        assert theirs[0, order[:j]].all() and theirs[0, order[j + 1:]].sum() == 0  # transformers: j or j + 1
        extra += bool(theirs[0, order[j]])
    assert 50 < extra < 450, f"transformers kept the token after the boundary in {extra} of 500 cases"


@pytest.mark.parametrize(("probs", "top_p", "kept"), [
    ([0.5, 0.25, 0.125, 0.125], 0.75, [1, 1, 0, 0]),  # reaches 0.75 exactly after two tokens: stops there
    ([0.5, 0.25, 0.125, 0.125], 0.5, [1, 0, 0, 0]),
    ([0.5, 0.25, 0.125, 0.0625, 0.0625], 0.875, [1, 1, 1, 0, 0]),
    ([0.5, 0.25, 0.125, 0.0625, 0.0625], 0.8, [1, 1, 1, 0, 0]),  # 0.75 < 0.8 < 0.875: the crossing token kept
])
def test_exact_binary_boundaries_agree(probs, top_p, kept):
    logits = torch.tensor(probs).log().unsqueeze(0)
    sampling = SamplingConfig(1.0, top_p=top_p)
    assert (warp(logits, sampling) > 0).int().tolist() == (hf_warp(logits, sampling) > 0).int().tolist() == [kept]


def test_tied_probabilities_at_the_top_p_crossing_keep_as_many_tokens():
    logits = torch.tensor([0.4, 0.3, 0.3]).log().unsqueeze(0)
    sampling = SamplingConfig(1.0, top_p=0.5)
    ours, theirs = warp(logits, sampling) > 0, hf_warp(logits, sampling) > 0
    assert ours.sum() == theirs.sum() == 2 and ours[0, 0] and theirs[0, 0]


def test_the_differential_test_catches_top_p_before_temperature():
    [mutant] = warp_gallery()
    found = mismatches(mutant.make(Hits()), _random_logits(0))
    assert len(found) >= 20, found  # of the 80 configs
    assert all("top_p=1.0" not in config and "temperature=1.0" not in config for config in found)
