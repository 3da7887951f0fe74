"""Host memory marked for huge pages, for buffers a pass reads from end to end (the KV cache's arena).

A CPU pass at a long context reads every layer's cached keys and values once, thousands of 4 KB pages that the
weights' stream (on 2 MB pages, ``csrc/stream_slab.cpp``) has pushed out of the TLB: each costs a page walk. Memory
from ``huge_empty`` is an anonymous mapping, 2 MB-aligned inside, marked ``madvise(MADV_HUGEPAGE)`` (Linux with
transparent huge pages in "madvise" or "always" mode backs it with 2 MB pages where it can). Elsewhere, or for a
device other than the CPU, or for less than one huge page (where a 2 MB page would be mostly empty), it is
``torch.empty``. The mapping is unmapped when the last tensor over it goes.
"""

from __future__ import annotations

import math
import mmap

import torch

__all__ = ["HUGE_PAGE", "huge_empty"]

HUGE_PAGE = 2 << 20


def huge_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """An uninitialised tensor of ``shape`` on huge-page-marked host memory (``torch.empty`` where that is not had)."""
    device = torch.device(device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype, device=device)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive as long as a view of it lives
    skip = -raw.data_ptr() % HUGE_PAGE
    return raw[skip : skip + nbytes].view(dtype).view(shape)
