"""On CUDA: a drafter's sampled token (specfamily.core.host.draw) is drawn with no synchronisation the debug mode
flags (torch.multinomial(q, 1) makes 2), follows q (chi-square, zero-mass tokens never drawn) with the GPU's
generator, and with a host generator draws the CPU path's token. tests/core/test_host_draw.py runs the CPU side.
"""

from __future__ import annotations

import pytest
import torch

from specfamily.core import host
from specfamily.testing.cuda_syncs import debug_mode_syncs
from specfamily.testing.power import DEFAULT_SIGNIFICANCE
from specfamily.testing.stats import chi_square

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

Q = torch.tensor([0.0, 0.0, 0.30, 0.0, 0.15, 0.40, 0.0, 0.15, 0.0, 0.0])


def _warped(vocab: int = 49152) -> torch.Tensor:
    logits = 3 * torch.randn(vocab, generator=torch.Generator().manual_seed(0))
    probs = torch.softmax(logits / 0.7, dim=-1)
    return torch.where(probs >= probs.topk(50).values[-1], probs, 0.0)  # a top-k style row: zeros everywhere else


@pytest.mark.parametrize("generator", ["cuda", "cpu"])
def test_a_draw_makes_no_synchronisation(generator):
    q = _warped().cuda()
    gen = torch.Generator(device=generator).manual_seed(1)
    host.draw(q, gen)  # warm-up: the allocator and the kernels' first launch
    tokens, flagged = debug_mode_syncs(lambda: [host.draw(q, gen) for _ in range(8)])
    assert flagged == [], flagged
    assert all(q[t].item() > 0 for t in tokens)
    _, by_multinomial = debug_mode_syncs(lambda: torch.multinomial(q, 1, generator=torch.Generator(device="cuda")))
    assert len(by_multinomial) == 2, by_multinomial  # the counter's power: what the drafters paid


def test_the_law_on_the_gpus_generator():
    q, gen, n = Q.cuda(), torch.Generator(device="cuda").manual_seed(2), 20000
    tokens = torch.cat([host.draw(q, gen) for _ in range(n)]).cpu()
    counts = torch.bincount(tokens, minlength=Q.numel()).double()
    assert counts[Q == 0].sum() == 0
    _, p_value, _ = chi_square(counts, Q.double())
    assert p_value >= DEFAULT_SIGNIFICANCE


def test_a_host_generator_draws_the_cpu_paths_tokens():
    q = _warped()
    on_cpu, on_gpu = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    expected = [int(host.draw(q, on_cpu)) for _ in range(300)]
    got = [int(host.draw(q.cuda(), on_gpu)) for _ in range(300)]
    assert got == expected  # a parallel scan could split a boundary differently; the measure of that is ~1e-16
