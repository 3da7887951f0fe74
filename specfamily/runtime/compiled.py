"""An optional ``torch.compile`` of the lean forward's per-layer elementwise work, with the eager path as fallback.

``Compiled(fn)`` calls ``torch.compile(fn)`` (inductor: on a CPU it generates and builds C++ with the machine's
compiler) on its first call. Where that fails (no compiler, an unsupported op, a torch without inductor) it logs one
warning naming why, keeps ``reason``, and runs ``fn`` eagerly from then on: a pass never fails for the option.
Only float32 tensors go to the compiled function: inductor computes lower precisions in float32 and rounds once,
which is not the eager op-by-op rounding the lean forward's bit-identity rests on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Compiled"]

logger = logging.getLogger(__name__)


@dataclass
class Compiled:
    """``fn`` compiled on first use, or ``fn`` itself once compiling or running the compiled version failed."""

    fn: Callable[..., tuple[torch.Tensor, ...]]
    compiled: Callable[..., tuple[torch.Tensor, ...]] | None = None
    reason: str | None = None  # why the eager path runs, once it does
    calls: int = 0  # calls that ran the compiled function

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.reason is not None or tensors[0].dtype != torch.float32:
            return self.fn(*tensors)
        try:
            if self.compiled is None:
                self.compiled = torch.compile(self.fn, dynamic=True)
            out = self.compiled(*tensors)
        except Exception as err:  # noqa: BLE001 - any failure of the compiler stack falls back to eager
            self.reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.warning("torch.compile of the lean forward failed, running it eagerly: %s", self.reason)
            return self.fn(*tensors)
        self.calls += 1
        return out

    @property
    def active(self) -> bool:
        """Whether calls go to the compiled function (until one fails)."""
        return self.reason is None
