"""Batch-invariant attention for decode and verify passes (``csrc/attention/attention.cpp``): built on first use,
cached, or why not.

``attend(query, key, value, visible, scale)`` is softmax(q k^T * scale over the keys each row sees) v for one pass of
a few rows (batch 1, float32, CPU): per key/value head, the group's query rows (query heads x fed rows) run against
the cache's keys and values read once, in blocks that stay in L1. A row's output bits depend only on its own query
and on the sequence of keys it sees (in cache order), never on the other rows of the pass or on where those keys
lie: a row of a chain or a tree gets exactly the bits of the plain pass that would have fed that token, which is what
keeps greedy text identical to plain decoding when the lean forward attends with it (``Attend.kernel``). Its bits
differ from sdpa's in the last places (another order of the same sums).

``kernel_visible`` turns the pass's own 4D mask (additive 0 / hidden, or boolean) into the (rows, keys) visibility the
kernel takes, once per pass; a mask with other values (a real additive bias) is not taken and the pass runs sdpa.

Built like the stream kernel (``specfamily.runtime.kernel.build_extension``); where it cannot build (no compiler, a
compile error, ``SPECFAMILY_NO_ATTENTION`` set) it logs one warning naming why and the passes run sdpa.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from specfamily.runtime.kernel import Extension, build_source, load_extension, stream_kernel

__all__ = ["DISABLE_ENV", "MAX_ROWS", "attention_build", "attention_for", "attention_kernel", "attention_source",
           "build_attention", "kernel_visible", "vectorised"]

logger = logging.getLogger(__name__)

DISABLE_ENV = "SPECFAMILY_NO_ATTENTION"  # set (non-empty, not "0"): never build, passes run sdpa
NAME = "specfamily_attention"
MAX_ROWS = 64  # fed rows past which a pass (a prefill) runs sdpa


def attention_source() -> Path:
    """The C++ source of the extension, shipped inside the package."""
    return Path(__file__).resolve().parent / "csrc" / "attention" / "attention.cpp"


@functools.cache
def attention_build() -> Extension:
    """The extension, built (or loaded from the cache) once per process; on failure one warning and the reason."""
    return load_extension(DISABLE_ENV, build_attention, logger, "attention kernel", "passes attend with sdpa")


@functools.cache
def build_attention(verbose: bool = False) -> ModuleType:
    """Compile (or reuse the cached build of) the extension and import it; raises ``KernelUnavailable`` or the
    build's own error."""
    return build_source(NAME, attention_source(), "attention", "attention kernel", verbose,
                        headers=("attention_head.h", "attention_avx512.h", "attention_avx2.h"))


def attention_kernel(enabled: bool = True) -> ModuleType | None:
    """The built module when ``enabled`` and it builds (else None: one warning on a failed build)."""
    return attention_build().module if enabled else None


def attention_for(lean, enabled: bool | str = "auto") -> Callable[..., torch.Tensor] | None:
    """The kernel (the module's ``attend``: a builtin function, shared by deep copies) for ``lean`` (a ``LeanLlama``),
    or None (its passes attend with sdpa): not ``enabled``, no lean forward, one that does not multiply with the
    stream kernel (only then is a whole pass batch-invariant), a model off the CPU or not float32, or no build (one
    warning). ``"auto"``: as True where the kernel runs its AVX-512 loops (a head width they take: what was measured
    faster than sdpa, docs/pass-cost.md), else sdpa; True: the kernel wherever it builds (AVX2's loops and the scalar
    one too: batch-invariant, slower than sdpa on verify passes)."""
    if enabled not in (True, False, "auto"):
        raise ValueError(f"native_attention must be True, False or 'auto', got {enabled!r}")
    if not enabled or lean is None:
        return None
    stream = stream_kernel().module
    weight = lean._layers[0].q[0]
    if (stream is None or lean._linear is not stream.linear or weight.device.type != "cpu"
            or weight.dtype != torch.float32):
        logger.debug("attention kernel not used: needs a float32 CPU lean forward multiplying with the stream kernel")
        return None
    module = attention_kernel()
    if module is None:
        return None
    if enabled == "auto" and not vectorised(module, lean._layers[0].head_dim):
        logger.debug("attention kernel not used by default: its AVX-512 loops do not run here (native_attention=True "
                     "asks for it)")
        return None
    return module.attend


def vectorised(module: ModuleType, head_dim: int) -> bool:
    """The kernel runs its AVX-512 loops for heads ``head_dim`` wide (a multiple of 16, at most 128) on this CPU."""
    return module.isa() == "avx512" and head_dim % 16 == 0 and head_dim <= 128


def kernel_visible(mask: torch.Tensor | None, q_len: int) -> tuple[bool, torch.Tensor | None]:
    """(whether the kernel can take this pass, its (q, keys) bool visibility or None for every key).

    Taken: no mask and one fed row (it sees the whole cache), or a (1, 1, q, keys) mask, boolean or additive with only
    0 (seen) and -inf / the dtype's minimum (hidden), with every row seeing at least one key, and at most
    ``MAX_ROWS`` rows. Not taken: anything else (a causal pass without a mask, a batch, a real additive bias)."""
    if q_len > MAX_ROWS:
        return False, None
    if mask is None:
        return q_len == 1, None
    if mask.dim() != 4 or mask.shape[:3] != (1, 1, q_len) or mask.device.type != "cpu":
        return False, None
    rows = mask[0, 0]
    if rows.dtype == torch.bool:
        visible = rows.contiguous()
    else:
        visible = rows == 0
        if not bool(((rows == torch.finfo(rows.dtype).min) | (rows == float("-inf")) | visible).all()):
            return False, None
    if not bool(visible.any(-1).all()):
        return False, None
    return True, visible
