"""The attention kernel's per-row key lists (``visible_keys`` in ``csrc/attention/attention.cpp``): every call of
``attend`` turns its (rows, keys) visibility into each row's ascending key indices. The AVX-512 loop (sixteen keys a
step, compressed) and the branch-free scalar loop must give exactly ``visible[r].nonzero()``: a key too many, too few
or out of order would change which keys a row attends to."""

from __future__ import annotations

import pytest
import torch

from specfamily.runtime.attention import attention_build

needs_kernel = pytest.mark.skipif(
    not attention_build().available, reason=f"no attention kernel: {attention_build().reason}"
)


def _expected(visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, length = visible.shape
    index = torch.zeros(rows, length, dtype=torch.int32)
    count = visible.sum(-1).to(torch.int32)
    for r in range(rows):
        keys = visible[r].nonzero()[:, 0]
        index[r, : keys.numel()] = keys.to(torch.int32)
    return index, count


@needs_kernel
@pytest.mark.parametrize("vector", [True, False])
@pytest.mark.parametrize("length", [1, 15, 16, 17, 33, 255, 805])
def test_visible_keys_are_each_rows_seen_keys_in_order(vector: bool, length: int) -> None:
    module = attention_build().module
    gen = torch.Generator().manual_seed(length)
    visible = torch.rand(9, length, generator=gen) < torch.linspace(0.0, 1.0, 9)[:, None]
    visible[0] = False  # no key
    visible[-1] = True  # every key
    if length > 5:  # a chain's rows: the cache, then causal among the 5 fed rows
        visible[1:6] = True
        visible[1:6, length - 5 :] = torch.ones(5, 5, dtype=torch.bool).tril()
    index, count = module.visible_keys(visible, vector)
    expected_index, expected_count = _expected(visible)
    assert torch.equal(count, expected_count)
    assert torch.equal(index, expected_index)


@needs_kernel
def test_visible_keys_refuses_a_non_bool_visibility() -> None:
    with pytest.raises(RuntimeError, match="attention: visible must be a contiguous 2-D bool tensor"):
        attention_build().module.visible_keys(torch.ones(2, 3), True)
