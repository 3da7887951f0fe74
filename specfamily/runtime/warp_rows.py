"""Warping a few rows of logits in one C++ call (``csrc/warp/warp_rows.cpp``): built on first use, cached, or why not.

``specfamily.core.sampling.warp`` on the CPU makes about thirty small ATen calls a row (the division by the
temperature, top-k's ``topk`` and mask, the softmax, the threshold head's block maxima, nonzeros, gathers, sort and
cumsum, the kept row's scatter, sum and division); each one a round trip through the interpreter of a few
microseconds. ``warp_rows`` makes the dense ones (division, softmax, sum, division) as the same ATen calls from C++ and
the head's selection as one loop over the row, so its probabilities are those of the torch path bit for bit (tests
compare them with ``torch.equal``); the rows it does not settle are reported, and the caller warps them the torch way.

Built like the stream kernel (``specfamily.runtime.kernel.build_extension``: the user's cache, one folder per sources,
flags, CPU, torch and Python, a file lock), once per process. Where it cannot build (no compiler, a compile error,
``SPECFAMILY_NO_WARP_KERNEL`` set) it logs one warning naming why and every row takes the torch path (greedy runs
build it too: their argmax is ``greedy_rows``, so the warning names both).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

import torch

from specfamily.runtime.kernel import Extension, build_source, load_extension

__all__ = ["DISABLE_ENV", "build_warp", "greedy_rows", "warp_build", "warp_rows", "warp_source"]

logger = logging.getLogger(__name__)

DISABLE_ENV = "SPECFAMILY_NO_WARP_KERNEL"  # set (non-empty, not "0"): never build, warp with torch ops
NAME = "specfamily_warp_rows"


def warp_source() -> Path:
    """The C++ source of the extension, shipped inside the package."""
    return Path(__file__).resolve().parent / "csrc" / "warp" / "warp_rows.cpp"


@functools.cache
def warp_build() -> Extension:
    """The extension, built (or loaded from the cache) once per process; on failure one warning and the reason."""
    return load_extension(
        DISABLE_ENV, build_warp, logger, "warp kernel", "rows are warped and greedy rows argmaxed with torch ops"
    )


@functools.cache
def build_warp(verbose: bool = False) -> ModuleType:
    """Compile (or reuse the cached build of) the extension and import it; raises ``KernelUnavailable`` or the
    build's own error."""
    return build_source(NAME, warp_source(), "warp_rows", "warp kernel", verbose, headers=())


def warp_rows(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(B, V) float32 CPU logits -> ((B, V) probabilities, (B,) bool: the rows settled), or None without the
    extension. A settled row is ``warp``'s torch path's row bit for bit; the others hold no result."""
    module = warp_build().module
    if module is None:
        return None
    return module.warp_rows(logits, float(temperature), int(top_k), float(top_p))


def greedy_rows(logits: torch.Tensor) -> torch.Tensor | None:
    """(B, V) float32 CPU logits -> (B,) int64: each row's ``max(-1).indices`` (the first of tied maxima, the first
    NaN where there is one), in two vectorised passes over each row; None without the extension or for other
    logits."""
    module = warp_build().module
    if (
        module is None
        or logits.dim() != 2
        or logits.dtype != torch.float32
        or logits.device.type != "cpu"
        or logits.shape[1] == 0
    ):
        return None
    return module.greedy_rows(logits)
