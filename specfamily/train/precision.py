"""Where and in what precision the trainers run: ``--device auto|cpu|cuda|cuda:N`` and
``--dtype auto|float32|bfloat16|float16``.

16-bit training is mixed precision: float32 master weights, forward passes under ``torch.autocast``, and for float16
a ``torch.amp.GradScaler`` on the loss. ``auto`` (the default): a GPU when there is one, and there bfloat16; else the
CPU in float32 (as the runner picks its device).
"""

from __future__ import annotations

import argparse
import contextlib
import re
from dataclasses import dataclass

import torch

DTYPES = ("float32", "bfloat16", "float16")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(text: str) -> str:
    """``text`` when it names a device the trainers take (auto, cpu, cuda, cuda:N); ValueError otherwise."""
    if not isinstance(text, str) or not _DEVICE.fullmatch(text):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got {text!r} (or 'auto': a GPU "
                         "when there is one)")
    return text


def check_dtype(text: str) -> str:
    """``text`` when it is one of :data:`DTYPES` or ``auto``; ValueError otherwise."""
    if text != "auto" and text not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {text!r} (or 'auto': bfloat16 on a GPU, "
                         "float32 on the CPU)")
    return text


def concrete_device(text: str) -> str:
    """A checked ``--device``, ``auto`` made ``cuda`` when CUDA is available, else ``cpu``."""
    if check_device(text) != "auto":
        return text
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_arg(text: str) -> str:
    """argparse ``type`` for ``--device``: the check's message as the usage error."""
    try:
        return check_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def dtype_arg(text: str) -> str:
    """argparse ``type`` for ``--dtype``."""
    try:
        return check_dtype(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def resolve_device(text: str) -> torch.device:
    """The torch device for a checked name (``cuda`` with the current GPU's index, as models report theirs); a clear
    error when it asks for a GPU this machine does not have."""
    device = torch.device(concrete_device(text))
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"--device {text}: CUDA is not available on this machine (use --device cpu)")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"--device {text}: this machine has {count} CUDA device(s), numbered from 0")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


@dataclass(frozen=True)
class Precision:
    """A trainer's device and compute dtype (the weights stay float32)."""

    device: torch.device
    dtype: torch.dtype

    @classmethod
    def of(cls, device: str, dtype: str) -> Precision:
        """From the ``--device`` and ``--dtype`` options, checked (``auto`` dtype: bfloat16 on a GPU, else float32)."""
        where = resolve_device(device)
        if check_dtype(dtype) == "auto":
            dtype = "bfloat16" if where.type == "cuda" else "float32"
        return cls(where, getattr(torch, dtype))

    @property
    def frozen_dtype(self) -> torch.dtype:
        """The dtype a frozen target is loaded in for training: float32 on the CPU (its 16-bit products are slow
        there), else the compute dtype (an 8B target in float32 is 32 GB of GPU memory for nothing)."""
        return torch.float32 if self.device.type == "cpu" else self.dtype

    @property
    def mixed(self) -> bool:
        return self.dtype != torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the forward passes and the loss run in: autocast to ``dtype``, or nothing for float32."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def scaler(self) -> torch.amp.GradScaler:
        """A loss scaler, enabled for float16 only (a disabled one passes every call straight through)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)


def frozen_target(name: str, device: torch.device, flag: str, given=None, dtype: torch.dtype = torch.float32,
                  **options):
    """The frozen target a trainer reads on ``device`` (``flag``: the ``--device`` it came from): ``given`` (refused
    on another device) or ``name`` loaded in ``dtype`` (``options``: :func:`~specfamily.core.target.load_target`'s)."""
    from specfamily.core import target as targets

    if given is None:
        given = targets.load_target(name, device=device, dtype=dtype, **options)
    elif given.device != device:
        raise ValueError(f"the target given is on {given.device}, not on --device {flag}")
    given.model.requires_grad_(False)
    return given


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, parameters, clip: float,
                   scaler: torch.amp.GradScaler) -> None:
    """Backward, unscale, clip the gradient norm to ``clip`` and step (the scaler may skip a step with inf/nan
    gradients); the plain sequence when the scaler is disabled."""
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(parameters, clip)
    scaler.step(optimizer)
    scaler.update()
