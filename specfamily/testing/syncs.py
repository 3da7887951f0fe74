"""Host synchronisations counted without an accelerator: what a piece of tensor code would make the host wait for.

On a GPU, ``torch.cuda.set_sync_debug_mode("warn")`` flags every call that goes through c10's ``memcpy_and_sync`` or
``stream_synchronize``. This module counts the same calls on a machine with no GPU, so that a drafter author (or the
verifier's own tests) can assert "one synchronisation a pass" in CI:

- :func:`on_device` wraps a CPU tensor as a **stand-in** for a tensor on an accelerator: it reports device ``meta``
  (not ``cpu``, so code that asks ``tensor.device`` takes its accelerator path and moves host tensors to it), and
  computes on its real CPU values, so results are exact.
- :class:`SyncCounter` is a ``TorchDispatchMode``: inside it, every aten op is classified and stand-ins propagate
  (an op with a stand-in operand, or a factory asked for device ``meta``, makes stand-ins). It records, with the
  file:line of the calling code outside torch:

  ==========================  =========================================================================================
  kind                        what, and where torch syncs on CUDA
  ==========================  =========================================================================================
  ``read``                    ``aten._local_scalar_dense`` of a stand-in: ``item()``, ``bool()`` / ``if t:``,
                              ``int()``, ``float()``, a 0-dim tensor used as an index (Scalar.cu: memcpy_and_sync)
  ``copy to host``            a blocking device-to-host copy: ``.cpu()``, ``.to("cpu")``, ``.tolist()``,
                              ``.numpy()``, ``host.copy_(device)`` (Copy.cu: memcpy_and_sync when not non_blocking)
  ``copy to device``          a blocking host-to-device copy (the same memcpy_and_sync): ``.to(device)`` of a host
                              tensor, ``torch.tensor(data, device=...)``, a host index tensor in advanced indexing
                              (TensorAdvancedIndexing.cpp moves it with ``.to``), a 0-dim host operand of ``where``
                              (TensorCompare.cpp moves it with ``.to``)
  ``data-dependent shape``    ops whose output size is read back (Nonzero.cu: memcpy_and_sync of the count):
                              nonzero, masked_select, unique*, bincount,
                              repeat_interleave without output_size, a boolean index (nonzero), equal, mode
                              (some, unique, may wait inside thrust, which the debug mode does not flag)
  ``read inside an op``       reads an aten op makes inside itself (no dispatch mode sees them; CUDA's kernels share
                              them): multinomial without replacement or of one sample, 2 (its probabilities checked,
                              Distributions.cpp), searchsorted with a sorter, 2 (the sorter's range,
                              BucketizationUtils.h), normal with a tensor std, 1 (std >= 0, DistributionTemplates.h)
  ==========================  =========================================================================================

  Non-blocking copies are listed in ``queued`` and not counted (CUDA's debug mode does not flag them either).

What it cannot see: synchronisations inside C++/Triton extensions or custom kernels; ``torch.cuda.synchronize``,
stream and event waits (no CPU analogue); implicit waits of the CUDA runtime (``cudaMalloc`` / ``cudaFree``, a
non-blocking copy into pageable host memory, which CUDA performs synchronously without the debug mode's flag);
code that branches on ``device.type == "cuda"`` (stand-ins say ``meta``); an op whose CUDA kernel alone reads a
value back under a name not listed above. A count here is a lower bound of the GPU's; tests/gpu checks the GPU.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

STAND_IN = torch.device("meta")  # the device stand-ins report

_aten = torch.ops.aten
_DATA_DEPENDENT = {
    _aten.nonzero.default, _aten.masked_select.default, _aten._unique.default, _aten._unique2.default,
    _aten.unique_dim.default, _aten.unique_consecutive.default, _aten.unique_dim_consecutive.default,
    _aten.bincount.default, _aten.equal.default, _aten.mode.default,
}
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy}
_FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}  # built on the host, copied
_HERE = str(Path(__file__).resolve())
_TORCH = str(Path(torch.__file__).resolve().parent)


class StandIn(torch.Tensor):
    """A CPU tensor standing in for one on an accelerator (device ``meta``); ``inner`` holds its values."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> StandIn:
        # a normal tensor even under inference mode: a view of a normal tensor made there must be one (autograd sets
        # the view's version counter from its base's, which an inference tensor refuses), and a normal tensor may be
        # used wherever an inference tensor may
        with torch.inference_mode(False):
            wrapper = torch.Tensor._make_wrapper_subclass(
                cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(), dtype=inner.dtype,
                device=STAND_IN, requires_grad=False)
        wrapper.inner = inner
        return wrapper

    def __repr__(self) -> str:
        return f"StandIn({self.inner!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _HOST_READS:  # C++ refuses these on a subclass: read through a (counted) copy to the host
            return func(args[0].to("cpu"), *args[1:], **(kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return _kept(out, args[0] if args else None)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return execute(*as_copy(func, args, kwargs or {}))  # outside a SyncCounter: computed, not counted


def _kept(out, source):
    """``out`` itself, or the stand-in ``source`` where a call that changes nothing (``.to`` its own device and
    dtype, ``.contiguous()`` of a contiguous one) handed back its bare device tensor."""
    if (isinstance(out, torch.Tensor) and not isinstance(out, StandIn) and out.device == STAND_IN
            and isinstance(source, StandIn) and (out.shape, out.dtype) == (source.shape, source.dtype)):
        return source
    return out


def on_device(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` as a stand-in for a tensor on an accelerator (its values shared, not copied); None stays None."""
    if tensor is None or isinstance(tensor, StandIn):
        return tensor
    return StandIn(tensor)


def stand_in_module(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every parameter and buffer a stand-in (in place; values shared): a model "on an accelerator"
    whose whole forward a :class:`SyncCounter` follows. Build what derives from it (a Target, its caches and lean
    forward) inside the counter, so that the tensors made from its weights are stand-ins too."""
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is not None:
                    table[name] = on_device(tensor.detach())
    return module


def on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A stand-in's CPU values (no copy, not counted): for a test's own checks."""
    return tensor.inner if isinstance(tensor, StandIn) else tensor


@dataclass
class Sync:
    """One synchronising call: its kind (see the module docstring), the aten op and the caller's file:line."""

    kind: str
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} ({self.op}) at {self.where}"


class SyncCounter(TorchDispatchMode):
    """Counts the host synchronisations of the code run inside it (``with SyncCounter() as syncs: ...``).

    ``syncs``: the synchronising calls in order; ``queued``: the non-blocking transfers (not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[Sync] = []
        self.queued: list[Sync] = []
        self._host_data = _HostData(self)

    def __enter__(self):
        self._host_data.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._host_data.__exit__(*exc)

    @property
    def count(self) -> int:
        return len(self.syncs)

    def __repr__(self) -> str:  # what a failed assertion prints
        return f"{self.count} synchronisation(s): {[str(sync) for sync in self.syncs]}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        func, args, kwargs = as_copy(func, args, kwargs or {})
        kind, queued = classify(func, args, kwargs)
        if kind is not None:
            (self.queued if queued else self.syncs).append(Sync(kind, str(func), caller()))
        self.syncs += [Sync("read inside an op", str(func), caller()) for _ in range(reads_inside(func, args, kwargs))]
        return execute(func, args, kwargs)


class _HostData(TorchFunctionMode):
    """``torch.tensor(data, device=...)``, ``as_tensor``, ``asarray`` and ``new_tensor`` onto the stand-in device:
    built on the host and copied with a wait (torch builds them below the dispatcher, so the op mode never sees
    them): counted as a blocking copy to the device, the result a stand-in."""

    def __init__(self, counter: SyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _FROM_HOST_DATA:
            return func(*args, **kwargs)
        method = func is torch.Tensor.new_tensor
        device = kwargs.get("device", args[0].device if method else None)
        data = args[1] if method else args[0]
        if device is None or torch.device(device) != STAND_IN or isinstance(data, StandIn):
            return _kept(func(*args, **kwargs), data)  # ``as_tensor`` of a stand-in as it is: the stand-in
        if method:
            kwargs = {"dtype": args[0].dtype, **kwargs}
        made = func(*map(on_host, args), **{**kwargs, "device": torch.device("cpu")})
        if made.numel():  # an empty tensor's copy returns before it copies (Copy.cpp: nothing to wait for)
            self.counter.syncs.append(Sync("copy to device", func.__name__, caller()))
        return StandIn(made)


def count_syncs(fn: Callable[[], Any]) -> tuple[Any, SyncCounter]:
    """fn()'s result and the SyncCounter that watched it."""
    with SyncCounter() as counter:
        result = fn()
    return result, counter


def classify(func, args: tuple, kwargs: dict) -> tuple[str | None, bool]:
    """(the kind of synchronisation ``func`` makes on these operands or None, whether it is only queued)."""
    operands = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, torch.Tensor)]
    stand_in = any(isinstance(t, StandIn) for t in operands)
    if func in (_aten._to_copy.default, _aten.copy_.default):
        return _transfer(func, args, kwargs)
    if not stand_in:
        return None, False
    if func is _aten._local_scalar_dense.default:
        return "read", False
    if func in _DATA_DEPENDENT or (func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None):
        return "data-dependent shape", False
    if func in _INDEXING:
        indices = [t for t in tree_flatten(args[1])[0] if isinstance(t, torch.Tensor)]
        if any(t.dtype in (torch.bool, torch.uint8) for t in indices):
            return "data-dependent shape", False
        if any(not isinstance(t, StandIn) for t in indices):
            return "copy to device", False
    if func is _aten.where.self and any(not isinstance(t, StandIn) and t.dim() == 0 for t in args[:3]):
        return "copy to device", False
    return None, False


def as_copy(func, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """``aten.to`` as inference mode dispatches it (whole, not as the ``_to_copy`` it makes) turned into that
    ``_to_copy`` when it moves its tensor to another device (``.cpu()`` of a stand-in in a drafter's
    ``torch.inference_mode``), so the copy is counted and its result is a host tensor; anything else unchanged."""
    if func.overloadpacket is not _aten.to or func is _aten.to.dtype:
        return func, args, kwargs
    if func is _aten.to.dtype_layout:
        device, dtype, non_blocking = kwargs.get("device"), kwargs.get("dtype"), kwargs.get("non_blocking", False)
    elif func is _aten.to.other:
        device, dtype = args[1].device, args[1].dtype
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    else:  # aten.to.device
        device, dtype = args[1], args[2]
        non_blocking = args[3] if len(args) > 3 else kwargs.get("non_blocking", False)
    source = args[0]
    if device is None or torch.device(device) == source.device:
        return func, args, kwargs
    copy = {"dtype": dtype or source.dtype, "device": torch.device(device), "non_blocking": bool(non_blocking)}
    return _aten._to_copy.default, (source,), copy


def reads_inside(func, args: tuple, kwargs: dict) -> int:
    """How many values ``func`` reads back inside itself on these operands (0 unless a stand-in is one of them):
    the ``read inside an op`` row of the module docstring's table."""
    if not any(isinstance(leaf, StandIn) for leaf in tree_flatten((args, kwargs))[0]):
        return 0
    if func is _aten.multinomial.default:
        samples, replacement = args[1], args[2] if len(args) > 2 else kwargs.get("replacement", False)
        return 2 if args[0].numel() and (not replacement or samples == 1) else 0
    if func in (_aten.searchsorted.Tensor, _aten.searchsorted.Scalar):
        sorter = kwargs.get("sorter")
        return 2 if sorter is not None and sorter.numel() else 0
    if func in (_aten.normal.Tensor_Tensor, _aten.normal.float_Tensor):
        return 1 if args[1].numel() else 0
    return 0


def _transfer(func, args: tuple, kwargs: dict) -> tuple[str | None, bool]:
    """A copy between host and stand-in: its direction, and whether it is non-blocking (queued)."""
    non_blocking = kwargs.get("non_blocking", False)
    if func is _aten._to_copy.default:
        source, target_device = args[0], kwargs.get("device")
        to_device = target_device is not None and torch.device(target_device) == STAND_IN
        to_host = target_device is not None and torch.device(target_device).type == "cpu"
        moves = (to_device and not isinstance(source, StandIn)) or (to_host and isinstance(source, StandIn))
    else:
        target, source = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else non_blocking
        to_device = isinstance(target, StandIn)
        moves = to_device != isinstance(source, StandIn)
    if not moves or source.numel() == 0:  # an empty copy returns before it copies (Copy.cpp)
        return None, False
    return ("copy to device" if to_device else "copy to host"), bool(non_blocking)


def execute(func, args: tuple, kwargs: dict):
    """Run ``func`` on the stand-ins' CPU values; its tensor results are stand-ins when an operand was one or when
    it was asked for the stand-in device, host tensors when copied to the host; in-place results are the operand."""
    leaves = tree_flatten((args, kwargs))[0]
    if any(isinstance(leaf, torch.Tensor) and not isinstance(leaf, StandIn) and leaf.device == STAND_IN
           for leaf in leaves):
        raise RuntimeError(f"{func}: a tensor on {STAND_IN} that is no stand-in (made outside the counter's view); "
                           "make device tensors with specfamily.testing.syncs.on_device")
    device_kw = kwargs.get("device")
    to_stand_in = device_kw is not None and torch.device(device_kw) == STAND_IN
    to_host = device_kw is not None and torch.device(device_kw).type == "cpu"
    stand_in = to_stand_in or (any(isinstance(leaf, StandIn) for leaf in leaves) and not to_host)
    if func is _aten.copy_.default:
        stand_in = isinstance(args[0], StandIn)
    unwrapped = tree_map(on_host, args)
    kw = {k: (torch.device("cpu") if k == "device" and to_stand_in else tree_map(on_host, v))
          for k, v in kwargs.items()}
    out = func(*unwrapped, **kw)
    by_inner = {id(arg.inner): arg for arg in leaves if isinstance(arg, StandIn)}

    def wrap(value):
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in by_inner:
            return by_inner[id(value)]  # an in-place op's result: the operand itself
        return StandIn(value) if stand_in and value.device.type == "cpu" else value

    return tree_map(wrap, out)


def caller(*skipped: str) -> str:
    """file:line of the innermost frame outside torch, this module and the ``skipped`` files (resolved paths): the
    code that made the call."""
    for frame in reversed(traceback.extract_stack()):
        path = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else frame.filename
        if path != _HERE and path not in skipped and not path.startswith(_TORCH):
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"
