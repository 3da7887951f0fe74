"""Int8 weight-only products for 8-bit drafts (``csrc/int8/int8_linear.cpp``): built on first use, cached, or why not.

A weight W (n, d) is quantized per output row, symmetric: s_c = max_t |W[c, t]| / 127, Q = round(W / s) in
[-127, 127] (a zero row gets s = 1, Q = 0), and packed as the stream kernel packs float weights: panels of 16 output
rows, input-major, (ceil(n / 16), d, 16) int8, zero-padded past n (``pack_int8``). ``Int8Weight.__call__`` computes
x @ (Q * s)^T + b for float32 x of any number of rows (16 at a time): the activations are not quantized, each
output accumulates in float32 over the inputs in order and is scaled once. It reads a quarter of the float weight's
bytes, which is the time of a draft step at 1-16 rows. Paths: AVX2 + FMA and AVX-512 (the default: AVX-512 at 1-2
rows, AVX2 past them, where both run), a scalar loop elsewhere, and by name (``Int8Weight.__call__(x, "vnni")``) an
AVX-512 VNNI path that rounds each row of x to 16-bit integers (2^-16 of its largest magnitude) and sums in int32.

The extension is built like the stream kernel (``specfamily.runtime.kernel.build_extension``: the user's cache, one
folder per sources, flags, CPU, torch and Python, a file lock), once per process. Where it cannot build (no compiler,
no ninja, a compile error, or ``SPECFAMILY_NO_INT8_KERNEL`` set) ``int8_kernel()`` logs one warning naming why and
returns the reason; callers (``specfamily.drafters.shared.quantize``) then use torch.ao's dynamic int8 linears.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from specfamily.runtime.kernel import Extension, build_source, load_extension

__all__ = ["DISABLE_ENV", "PANEL", "Int8Kernel", "Int8Weight", "dequantize", "int8_kernel", "int8_source",
           "pack_int8", "quantize_rows"]

logger = logging.getLogger(__name__)

DISABLE_ENV = "SPECFAMILY_NO_INT8_KERNEL"  # set (non-empty, not "0"): never build, use torch.ao's int8 linears
NAME = "specfamily_int8_linear"
PANEL = 16  # output rows per packed panel (csrc's kPanel)
QMAX = 127  # symmetric int8 range [-QMAX, QMAX]


Int8Kernel = Extension  # the int8 kernel's record (``module.linear(x, packed, scales, n, bias=None)``)


def int8_source() -> Path:
    """The C++ source of the extension, shipped inside the package."""
    return Path(__file__).resolve().parent / "csrc" / "int8" / "int8_linear.cpp"


@functools.cache
def int8_kernel() -> Extension:
    """The kernel, built (or loaded from the cache) once per process; on failure one warning and the reason."""
    return load_extension(DISABLE_ENV, _build, logger, "int8 weight-only kernel",
                          "quantize=8 uses torch.ao's dynamic int8")


def _build() -> ModuleType:
    return build_source(NAME, int8_source(), "int8_linear", "int8 kernel", headers=("int8_vnni.h",))


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q (n, d) int8, s (n,) float32): W ~ Q * s[:, None], per output row, symmetric."""
    w = weight.detach().float()
    peak = w.abs().amax(dim=1) if w.shape[1] else torch.zeros(w.shape[0])
    scales = torch.where(peak > 0, peak / QMAX, torch.ones_like(peak))
    q = torch.round(w / scales[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scales.contiguous()


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """Q (n, d) int8 as panels (ceil(n / PANEL), d, PANEL), zero-padded past n."""
    n, d = q.shape
    panels = -(-n // PANEL)
    padded = torch.zeros(panels * PANEL, d, dtype=torch.int8)
    padded[:n] = q
    return padded.view(panels, PANEL, d).transpose(1, 2).contiguous()


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float weight the int8 product multiplies by: Q * s[:, None]."""
    return q.float() * scales[:, None]


@dataclass(frozen=True)
class Int8Weight:
    """One weight quantized and packed for the kernel; ``self(x)`` is x @ (Q * s)^T + bias (x float32, (..., d))."""

    packed: torch.Tensor  # (panels, d, PANEL) int8
    scales: torch.Tensor  # (n,) float32
    sums: torch.Tensor  # (n,) int32: sum_t Q[c, t] (the VNNI path's offset)
    bias: torch.Tensor | None  # (n,) float32
    n: int
    d: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Weight:
        q, scales = quantize_rows(weight)
        b = bias.detach().float().contiguous() if bias is not None else None
        sums = q.sum(dim=1, dtype=torch.int32).contiguous()
        return cls(pack_int8(q), scales, sums, b, weight.shape[0], weight.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: the packed int8 panels, the scales and the bias."""
        extra = self.bias.numel() * 4 if self.bias is not None else 0
        return self.packed.numel() + self.scales.numel() * 4 + extra

    def __call__(self, x: torch.Tensor, isa: str | None = None) -> torch.Tensor:
        module = _module()
        if isa is None:
            return module.linear(x, self.packed, self.scales, self.sums, self.n, self.bias)
        return module.linear_with(x, self.packed, self.scales, self.sums, self.n, self.bias, isa)

    def weight(self) -> torch.Tensor:
        """The dequantized float weight (n, d) (references and tests)."""
        q = self.packed.transpose(1, 2).reshape(-1, self.d)[: self.n]
        return dequantize(q, self.scales)


def _module() -> ModuleType:
    kernel = int8_kernel()
    if kernel.module is None:
        raise RuntimeError(f"the int8 weight-only kernel is not available here: {kernel.reason}")
    return kernel.module
