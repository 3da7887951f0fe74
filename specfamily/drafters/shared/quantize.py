"""8-bit drafts: a drafter's own weights run as int8, so one draft step reads a quarter of the bytes.

Two kernels, the same API (``Int8Linear``): on a CPU where it builds, the project's int8 weight-only product
(``specfamily.runtime.int8_matmul``: per-output-row symmetric int8 weights, float32 activations and sums, packed
panels read as one stream, 1-16 rows at a time); elsewhere (no compiler, a failed build, ``SPECFAMILY_NO_INT8_KERNEL``)
PyTorch's ``torch.ao`` dynamic quantization (fbgemm/x86: int8 weights, activations quantized per call), which reads
its int8 bytes at a fraction of the memory bus's rate at 1 row (docs/variants-hydra-quant.md). torchao 0.18's CPU
int8 tensors dequantize first and measured slower than float. ``torch.ao.quantization`` is deprecated in favour of
torchao, so its warnings are silenced here. 4-bit is refused: no maintained library runs 4-bit weights on this CPU
faster than float.

Losslessness does not depend on this module: a drafter reports the q it sampled from, which is the quantized
model's. Quantization runs on the CPU only; other devices are refused by name.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from specfamily.runtime.int8_matmul import Int8Weight, int8_kernel

QUANT_BITS = (0, 8)  # 0: float weights (the default); 8: int8 weights


def check_bits(bits) -> int:
    """The ``quantize`` option: 0 or 8."""
    if isinstance(bits, bool) or bits not in QUANT_BITS:
        raise ValueError(f"quantize must be 0 (float weights) or 8 (int8 weights), got {bits!r}; 4-bit drafts need a "
                         "library that runs them on this CPU, and none is maintained")
    return bits


def _check_cpu(device: torch.device | str) -> None:
    if torch.device(device).type != "cpu":
        raise ValueError(f"quantize=8 runs on the CPU only (CPU int8 kernels); the draft is on {device}")


class Int8Linear(nn.Module):
    """An int8 linear layer that takes and returns the caller's dtype and shape, one row (H,) included (the kernels
    are float32 and want rows). ``inner`` is the int8 weight-only kernel's ``Int8Weight`` (``kind`` "kernel") or a
    ``torch.ao`` dynamic quantized linear (``kind`` "torch.ao")."""

    def __init__(self, inner: Int8Weight | nn.Module) -> None:
        super().__init__()
        self.inner = inner

    @property
    def kind(self) -> str:
        return "kernel" if isinstance(self.inner, Int8Weight) else "torch.ao"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 1:  # the kernels want rows
            return self.inner(x.float()[None])[0].to(x.dtype)
        return self.inner(x.float()).to(x.dtype)


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, kernel: bool | None = None) -> Int8Linear:
    """An int8 copy of ``x -> x @ weight^T + bias`` (per-output-row int8 weights): the int8 weight-only kernel where
    it is available (``kernel`` None: when ``int8_kernel()`` built; True: required; False: never), else torch.ao's."""
    _check_cpu(weight.device)
    if kernel or (kernel is None and int8_kernel().available):
        if not int8_kernel().available:
            raise RuntimeError(f"the int8 weight-only kernel is not available here: {int8_kernel().reason}")
        return Int8Linear(Int8Weight.of(weight, bias))
    return Int8Linear(torch_ao_linear(weight, bias))


def torch_ao_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module:
    """A ``torch.ao`` dynamically quantized copy of ``x -> x @ weight^T + bias`` (per-channel int8 weights)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight.float())
        if bias is not None:
            linear.bias.copy_(bias.float())
    with warnings.catch_warnings():  # torch.ao's deprecation notices (module docstring)
        warnings.simplefilter("ignore")
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig

        linear.qconfig = per_channel_dynamic_qconfig
        return DynamicLinear.from_float(linear)


def quantize_linears(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` (in place) by its int8 copy; returns ``module``."""
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear:
            setattr(module, name, int8_linear(child.weight, child.bias))
        else:
            quantize_linears(child)
    return module


class Int8Linears:
    """A ``linear(x, weight, bias)`` for the lean forward (``specfamily.runtime.lean``) that multiplies the given
    weights by their int8 copies, made once, and any other weight in float as ``F.linear`` does."""

    def __init__(self, weights: Iterable[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
        self._table: dict[int, tuple[torch.Tensor, Int8Linear]] = {}
        self._direct: dict[int, Int8Weight] = {}  # the kernel's products, called without a module's frame
        for weight, bias in weights:  # keyed by storage; the float weight is kept so the key stays valid
            product = int8_linear(weight, bias)
            self._table[weight.data_ptr()] = (weight, product)
            if product.kind == "kernel":
                self._direct[weight.data_ptr()] = product.inner
        # float32 CPU weights: the lean forward may norm with the stream kernel's one-call RMSNorm (matmul.stream_norm)
        self.stream_norm = bool(self._table) and all(w.dtype == torch.float32 for w, _ in self._table.values())

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        key = weight.data_ptr()
        direct = self._direct.get(key)
        if direct is not None and x.dtype == torch.float32 and x.dim() > 1:
            return direct(x)
        entry = self._table.get(key)
        if entry is None:
            return F.linear(x, weight, bias)
        return entry[1](x)


def causal_lm_linears(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of every ``nn.Linear`` of a causal LM, its LM head included (tied or not)."""
    return [(m.weight, m.bias) for m in model.modules() if type(m) is nn.Linear]


def quantize_heads(heads: nn.Module) -> nn.Module:
    """Medusa/Hydra heads with int8 weights, in place: their linear layers, and the shared LM head (the target's, or
    its draft-vocabulary rows) replaced in the heads' own reference by an int8 copy (the target is untouched)."""
    quantize_linears(heads)
    shared = getattr(heads, "_lm_head", ())
    if shared:
        heads._lm_head = (int8_linear(shared[0].weight, getattr(shared[0], "bias", None)),)
    return heads
