"""The rope's cos and sin of every position up to a capacity, computed once and indexed per pass.

``specfamily.runtime.lean.rope`` computes a pass's cos and signed sin from its positions: about a dozen small ops
per pass, the same values for the same position every time. ``RopeTable`` computes them with that same function
once, for positions 0 .. capacity - 1, and a pass takes its rows by index: the values are bit-identical to the
per-pass ones (elementwise ops on the same inputs; tests compare them with ``torch.equal``), where every element of
the table and of a pass falls in the vectorised body of the elementwise kernels (``head_dim`` a multiple of 16), as
the scalar tail of ``cos``/``sin`` may round differently. Elsewhere, and for batched or large position tensors, it
calls ``rope`` as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TABLE_MIN", "RopeTable"]

TABLE_MIN = 256  # the first table's positions; it grows by half past the largest position asked for
_LANES = 16  # float32 lanes of the widest vector the elementwise kernels use (AVX-512)


@dataclass
class RopeTable:
    """``rope(rotary, hidden, position_ids)`` for batch-1 passes, by rows of a table kept for one rotary module."""

    rope: Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # lean.rope
    cos: torch.Tensor | None = None  # (capacity, D) in the hidden states' dtype, on their device
    sin: torch.Tensor | None = None  # (capacity, D) signed (``lean._signed``)
    key: tuple | None = None  # what the table was computed from: inv_freq (identity, version), scaling, dtype, device

    def __call__(self, rotary: nn.Module, hidden: torch.Tensor,
                 position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin (1, 1, q, D), as ``rope`` returns them."""
        inv_freq = rotary.inv_freq
        if (position_ids.dim() != 2 or position_ids.shape[0] != 1 or position_ids.device.type != "cpu"
                or (2 * inv_freq.numel()) % _LANES):
            return self.rope(rotary, hidden, position_ids)
        version = 0 if inv_freq.is_inference() else inv_freq._version  # an inference tensor is never changed in place
        key = (id(inv_freq), version, rotary.attention_scaling, hidden.dtype, hidden.device)
        if self.cos is None or key != self.key:
            self._build(rotary, hidden, TABLE_MIN, key)
        ids = position_ids.reshape(-1)
        try:
            cos, sin = self.cos.index_select(0, ids), self.sin.index_select(0, ids)
        except IndexError:  # a position past the table (or a negative one): grow it, or compute this pass's rows
            top = int(ids.max()) + 1
            if int(ids.min()) < 0 or top > 1 << 20:
                return self.rope(rotary, hidden, position_ids)
            self._build(rotary, hidden, top + top // 2, key)
            cos, sin = self.cos.index_select(0, ids), self.sin.index_select(0, ids)
        shape = (1, 1, ids.shape[0], cos.shape[-1])
        return cos.view(shape), sin.view(shape)

    def _build(self, rotary: nn.Module, hidden: torch.Tensor, capacity: int, key: tuple) -> None:
        positions = torch.arange(capacity, device=hidden.device)[None]
        cos, sin = self.rope(rotary, hidden[:1, :1], positions)  # (1, 1, capacity, D)
        self.cos, self.sin, self.key = cos[0, 0], sin[0, 0], key
