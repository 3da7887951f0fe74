"""The stream kernel's one-call RMSNorm (``csrc/rms_norm.cpp``) row by row: each row's bits are its own.

The mean of squares is summed in double in index order, one sequential chain a row, whether a row is normed alone or
with others (the rows' chains advance together): a drafted pass's rows get the bits of 1-row passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def sequential_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm's law, written apart: each row's squares summed in double one after the other (numpy's cumsum is
    sequential), then the float32 steps in the kernel's order."""
    rows = x.reshape(-1, x.shape[-1]).numpy()
    w = weight.numpy()
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        total = np.cumsum(row.astype(np.float64) ** 2)[-1]
        mean = np.float32(total / rows.shape[1])
        scale = np.float32(1.0) / np.sqrt(np.float32(mean + np.float32(eps)))
        out[r] = w * (row * scale)
    return torch.from_numpy(out).view(x.shape)


@pytest.mark.parametrize("rows", [1, 5, 8, 9, 13])
def test_every_row_is_summed_alone_in_order_whatever_rows_it_is_normed_with(module, rows):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, 576, generator=gen) * 3
    weight = torch.randn(576, generator=gen)
    together = module.rms_norm(x, weight, 1e-5)
    assert torch.equal(together, sequential_norm(x, weight, 1e-5))
    for r in range(rows):
        assert torch.equal(module.rms_norm(x[:, r : r + 1], weight, 1e-5), together[:, r : r + 1])
