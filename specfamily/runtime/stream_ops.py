"""The stream kernel's product and norm as ``torch.library`` custom ops, so that dynamo traces through them.

The kernel's functions (``specfamily.runtime.kernel``) are a pybind extension: ``torch.compile`` cannot see into
them and breaks its graph at every call. Registered here as ``torch.ops.specfamily.stream_linear`` and
``torch.ops.specfamily.stream_rms_norm``, each with a fake implementation (output shape and dtype only) for tracing,
they stay one opaque call each inside a compiled graph. The eager lean forward keeps calling the extension directly
(no dispatcher in between); only the compiled whole pass (``specfamily.runtime.compiled_pass``) uses these.

Registered on first use (``stream_ops()``), once per process, never at import. The weight reaches the kernel as the
same Python object (a Parameter keeps its object through the dispatcher), so its packed copy stays cached on it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = ["StreamOps", "stream_ops"]

NAMESPACE = "specfamily"


@dataclass(frozen=True)
class StreamOps:
    """The two registered ops: ``linear(x, weight, bias)`` and ``norm(x, weight, eps)`` (OpOverloads)."""

    linear: object  # torch.ops.specfamily.stream_linear.default
    norm: object  # torch.ops.specfamily.stream_rms_norm.default
    library: torch.library.Library  # the registration; the ops live as long as it does


@functools.cache
def stream_ops() -> StreamOps | None:
    """The ops, registered once per process; None where the stream kernel is not available.

    The extension's functions are the CPU implementations as they are (no Python frame between the dispatcher and
    the kernel: a call costs ~3 us more than calling the extension, against ~7 us through ``custom_op``'s wrapper,
    one thread); the fakes give the output's shape for tracing. No autograd: the lean forward runs in inference mode.
    """
    from specfamily.runtime.kernel import stream_kernel

    module = stream_kernel().module
    if module is None:
        return None
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define("stream_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
    library.define("stream_rms_norm(Tensor x, Tensor weight, float eps) -> Tensor")
    library.impl("stream_linear", module.linear, "CPU")
    library.impl("stream_rms_norm", module.rms_norm, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::stream_linear", _linear_shape, lib=library)
    torch.library.register_fake(f"{NAMESPACE}::stream_rms_norm", _norm_shape, lib=library)
    ops = getattr(torch.ops, NAMESPACE)
    return StreamOps(ops.stream_linear.default, ops.stream_rms_norm.default, library)


def _linear_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _norm_shape(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)
