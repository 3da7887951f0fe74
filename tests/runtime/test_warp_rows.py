"""The C++ warp (``specfamily.runtime.warp_rows``) gives ``warp``'s torch path's rows bit for bit, or says it did not.

Every comparison is ``torch.equal`` against ``specfamily.core.sampling.torch_warp`` (temperature, ``topk``'s top-k,
softmax, the threshold head or the bounded ``topk`` top-p): random rows at SmolLM2's vocabulary and at small ones,
peaked and flat, with -inf entries (suppressed tokens), ties at the k-th value and at the top-p crossing, exact
top-p boundaries, NaN and +inf rows. Each test also counts the rows the kernel settled, so that none passes on the
fallback alone; ``warp`` itself (kernel, then torch for the unsettled rows) equals the torch path on every row.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch

from specfamily.core import sampling
from specfamily.core.sampling import torch_warp, warp
from specfamily.core.types import SamplingConfig
from specfamily.runtime import kernel
from specfamily.runtime import warp_rows as warp_module
from specfamily.runtime.warp_rows import DISABLE_ENV, warp_build, warp_rows

needs_kernel = pytest.mark.skipif(not warp_build().available, reason=f"no warp kernel: {warp_build().reason}")

CONFIGS = [
    SamplingConfig(t, top_k=k, top_p=p)
    for t, k, p in itertools.product((0.3, 0.7, 1.0, 1.5), (0, 1, 5, 50), (1.0, 0.3, 0.9, 0.95))
]


def _rows(seed: int) -> list[torch.Tensor]:
    """Peaked, middling and flat rows at SmolLM2's vocabulary; rows of 4,096 and of 1,000 tokens (not a multiple of
    the head's 64-token blocks); a row with suppressed tokens (-inf)."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randn(3, 49152, generator=gen) * scale for scale in (8.0, 3.0, 0.5)]
    rows += [torch.randn(4, 4096, generator=gen) * 2, torch.randn(2, 1000, generator=gen) * 3]
    suppressed = torch.randn(2, 4096, generator=gen) * 4
    suppressed[:, ::3] = float("-inf")
    return [*rows, suppressed]


def _settled_rows_match(logits: torch.Tensor, sampling_config: SamplingConfig) -> int:
    """Assert the kernel's settled rows are the torch path's; how many it settled."""
    probs, settled = warp_rows(logits, sampling_config.temperature, sampling_config.top_k, sampling_config.top_p)
    reference = torch_warp(logits, sampling_config)
    assert torch.equal(probs[settled], reference[settled]), str(sampling_config)
    return int(settled.sum())


@needs_kernel
def test_settled_rows_are_the_torch_paths_bit_for_bit():
    settled = total = 0
    for config in CONFIGS:
        for logits in _rows(0):
            settled += _settled_rows_match(logits, config)
            total += logits.shape[0]
    assert settled >= 0.8 * total  # flat rows at top-p < 1 and rows of 1,000 tokens are the torch path's


@needs_kernel
def test_warp_is_the_torch_path_on_every_row():
    for config in CONFIGS:
        for logits in _rows(3):
            assert torch.equal(warp(logits, config), torch_warp(logits, config)), str(config)
            assert torch.equal(warp(logits[0], config), torch_warp(logits[0], config))  # one (V,) row


@needs_kernel
def test_ties_at_the_kth_value_and_at_the_crossing():
    logits = torch.zeros(4, 4096)
    logits[:, :10] = 5.0  # ten tied tokens at the top: top-k 5 keeps all ten, as masked_fill(scores < kth) does
    logits[1, 100:110] = 4.0
    logits[2, 3000:3010] = 5.0  # twenty tied across the row
    logits[3] = torch.randn(4096, generator=torch.Generator().manual_seed(4)).round()  # many ties everywhere
    for config in (
        SamplingConfig(1.0, top_k=5),
        SamplingConfig(1.0, top_k=5, top_p=0.5),
        SamplingConfig(0.7, top_p=0.33),
        SamplingConfig(0.3, top_k=12, top_p=0.9),
    ):
        assert _settled_rows_match(logits, config) == 4
    kept = warp(logits[:1], SamplingConfig(1.0, top_k=5))
    assert int((kept > 0).sum()) == 10


@needs_kernel
def test_exact_top_p_boundaries_stop_there():
    probs = torch.zeros(3, 4096)
    probs[0, [7, 9, 500]] = torch.tensor([0.5, 0.25, 0.25])  # 0.75 exactly after two tokens
    probs[1, [1, 2, 3, 4]] = 0.25
    probs[2, :3] = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log()  # softmax(log p) = p up to rounding; the tails are -inf
    for top_p in (0.75, 0.5, 0.8, 0.3):
        assert _settled_rows_match(logits, SamplingConfig(1.0, top_p=top_p)) == 3
    assert (warp(logits[:1], SamplingConfig(1.0, top_p=0.75)) > 0).sum() == 2


@needs_kernel
def test_the_mass_before_a_token_is_compared_with_top_p_in_float():
    """top_p a quarter of a float ulp above the float mass of the first j tokens: torch compares the mass before each
    token with top_p rounded to float (equal: token j is not kept); in double it would keep j + 1 tokens."""
    gen = torch.Generator().manual_seed(8)
    for _ in range(40):
        logits = 2 * torch.randn(1, 4096, generator=gen)
        probs = torch.softmax(logits, dim=-1)[0]
        ranked = probs.sort(descending=True).values
        j = int(torch.randint(2, 30, (1,), generator=gen))
        mass = float(ranked.cumsum(0)[j] - ranked[j])  # the float mass before the (j + 1)-th token
        top_p = mass + float(np.spacing(np.float32(mass))) / 4  # rounds to mass in float
        assert top_p > mass and float(np.float32(top_p)) == mass
        config = SamplingConfig(1.0, top_p=top_p)
        assert _settled_rows_match(logits, config) == 1
        assert int((warp(logits, config) > 0).sum()) == j


@needs_kernel
def test_rows_it_cannot_settle_are_reported_and_warped_by_torch():
    logits = torch.randn(5, 4096, generator=torch.Generator().manual_seed(5))
    logits[0, 17] = float("nan")
    logits[1, 3] = float("inf")
    logits[2] = 0.01 * logits[2]  # flat...
    logits[3] = float("-inf")  # no finite score: a NaN softmax
    config = SamplingConfig(1.0, top_k=50, top_p=0.9)
    settled = warp_rows(logits, 1.0, 50, 0.9)[1]
    assert settled.tolist() == [False, False, True, False, True]  # ...but top-k 50 keeps it short
    flat = 0.01 * torch.randn(1, 49152, generator=torch.Generator().manual_seed(6))
    assert not warp_rows(flat, 1.0, 0, 0.9)[1].any()  # without top-k a flat row of SmolLM2's vocabulary is topk's
    assert torch.equal(warp(flat, SamplingConfig(1.0, top_p=0.9)), torch_warp(flat, SamplingConfig(1.0, top_p=0.9)))
    assert not warp_rows(torch.randn(2, 1000), 1.0, 0, 0.9)[1].any()  # not a multiple of 64: never tried
    ours, reference = warp(logits, config), torch_warp(logits, config)
    assert ours[[0, 1, 3]].isnan().any(dim=1).all()  # the NaN rows stay what torch makes of them
    assert torch.equal(ours.nan_to_num(-1.0), reference.nan_to_num(-1.0))


def test_without_the_kernel_warp_is_the_torch_path(monkeypatch):
    monkeypatch.setattr(sampling, "warp_rows", lambda *args: None)
    for config in CONFIGS[::5]:
        logits = _rows(6)[1]
        assert torch.equal(warp(logits, config), torch_warp(logits, config))


@pytest.fixture
def unbuilt(monkeypatch):
    """A session where the warp kernel cannot build (the real build stays memoised for later tests)."""

    def fail(*args, **kwargs):
        raise RuntimeError("Error building extension 'specfamily_warp_rows'\nmore lines")

    monkeypatch.setattr(kernel, "build_extension", fail)  # what kernel.build_source calls
    warp_module.build_warp.cache_clear()
    warp_build.cache_clear()
    yield
    warp_module.build_warp.cache_clear()
    warp_build.cache_clear()


def test_a_failed_build_warns_once_and_warps_with_torch(unbuilt, caplog):
    logits = _rows(7)[0]
    config = SamplingConfig(0.7, top_p=0.9)
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.warp_rows"):
        first, second = warp(logits, config), warp(logits, config)
        greedy = sampling.greedy_tokens(logits)
    assert [r.getMessage() for r in caplog.records] == [
        "warp kernel unavailable (RuntimeError: Error building extension 'specfamily_warp_rows'): rows are warped "
        "and greedy rows argmaxed with torch ops"
    ]
    assert torch.equal(greedy, logits.argmax(-1))
    assert not sampling.native_available()
    assert torch.equal(first, torch_warp(logits, config)) and torch.equal(second, first)


def test_the_disable_switch_is_a_reason(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    warp_build.cache_clear()
    try:
        assert warp_build().reason == f"KernelUnavailable: {DISABLE_ENV} is set"
        assert warp_rows(torch.zeros(1, 64), 1.0, 0, 0.9) is None
    finally:
        warp_build.cache_clear()
