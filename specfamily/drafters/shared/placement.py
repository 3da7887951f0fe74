"""Build a drafter's modules where its target lives: on the target's device, in its floating dtype.

A module built in the default place is materialised on the CPU in float32 and then moved; for an 8B target's
EAGLE-3 head that is about 1.7 GB of host memory and a copy, and on the ``meta`` device it is a real allocation where
none is needed. Inside :func:`built_like` new parameters and buffers are created on the target's device and in its
dtype from the start; the ``.to(device, dtype)`` that follows is then a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def built_like(device: torch.device | str, dtype: torch.dtype) -> Iterator[None]:
    """Tensors created inside are made on ``device``; floating ones default to ``dtype`` when it is floating."""
    previous = torch.get_default_dtype()
    if dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def forked_rng(device: torch.device | str):
    """``torch.random.fork_rng`` over the host's generator and, for an accelerator, that device's: a seeded init
    inside leaves the caller's random state as it was wherever the init draws."""
    device = torch.device(device)
    if device.type in ("cpu", "meta"):
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device.index or 0], device_type=device.type)
