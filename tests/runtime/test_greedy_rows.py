"""The C++ warp's ``greedy_rows``: each row's ``max(-1).indices`` (the first of tied maxima, the first NaN), exactly.

Rows at SmolLM2's vocabulary and at sizes off the 16-float vector (tails, rows shorter than a vector), ties inside a
vector and across vectors, NaNs in the body and in the tail, infinities, all -inf rows, -0 against +0."""

from __future__ import annotations

import pytest
import torch

from specfamily.core import sampling
from specfamily.runtime import warp_rows as warp_module
from specfamily.runtime.kernel import Extension
from specfamily.runtime.warp_rows import greedy_rows, warp_build

needs_kernel = pytest.mark.skipif(not warp_build().available, reason=f"no warp kernel: {warp_build().reason}")


def _cases() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    cases = [torch.randn(5, width, generator=gen) * 4 for width in (49152, 1000, 33, 16, 7, 1)]
    ties = torch.zeros(6, 4096)
    ties[0, [5, 9]] = 3.0  # one vector
    ties[1, [40, 4000]] = 3.0  # two vectors
    ties[2, [4090, 4095]] = 3.0  # the last vector
    ties[3] = float("-inf")  # all -inf: the first
    ties[4, 100], ties[4, 3000] = float("inf"), float("inf")
    ties[5, 17], ties[5, 18] = -0.0, 0.0
    ties[5] -= 1.0
    ties[5, 17], ties[5, 18] = -0.0, 0.0
    cases.append(ties)
    nans = torch.randn(5, 1000, generator=gen)
    nans[0, 500] = float("nan")  # the body
    nans[1, 998] = float("nan")  # the tail (1000 = 62 * 16 + 8)
    nans[2, [3, 700]] = float("nan")  # the first of two
    nans[3, 0] = float("nan")
    nans[4, 10], nans[4, 900] = float("inf"), float("nan")  # a NaN after +inf
    cases.append(nans)
    tail = torch.full((2, 40), -5.0)
    tail[0, 35] = 1.0  # the maximum only in the tail
    tail[1, [2, 39]] = 1.0  # a tie between the body and the tail
    cases.append(tail)
    return cases


@needs_kernel
@pytest.mark.parametrize("case", range(len(_cases())))
def test_greedy_rows_are_max_indices_ties_nans_and_tails_included(case):
    logits = _cases()[case]
    expected = logits.max(dim=-1).indices
    found = greedy_rows(logits)
    assert found.dtype == torch.int64 and torch.equal(found, expected)
    assert torch.equal(found, logits.argmax(dim=-1))
    wide = torch.cat([logits, logits], dim=1)[:, : logits.shape[1]]  # not contiguous
    assert torch.equal(greedy_rows(wide), expected)


def test_greedy_rows_leaves_other_logits_to_torch():
    assert greedy_rows(torch.randn(3, 10, dtype=torch.float64)) is None
    assert greedy_rows(torch.randn(10)) is None
    assert greedy_rows(torch.randn(2, 3, 10)) is None
    assert greedy_rows(torch.randn(2, 0)) is None


@needs_kernel
def test_greedy_verification_takes_the_kernel(monkeypatch):
    calls = []
    module = warp_build().module

    class Counting:
        def greedy_rows(self, logits):
            calls.append(logits.shape)
            return module.greedy_rows(logits)

    monkeypatch.setattr(warp_module, "warp_build", lambda: Extension(Counting()))
    logits = torch.randn(5, 49152)
    assert torch.equal(sampling.greedy_tokens(logits), logits.max(-1).indices) and calls == [(5, 49152)]
    assert torch.equal(sampling.greedy_tokens(logits[0]), logits[0].max(-1).indices) and len(calls) == 1
