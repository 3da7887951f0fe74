"""torch.cuda's sync debug mode, read on a CUDA machine: which aten ops synchronised (:class:`CudaSyncOps`), or where
(:func:`debug_mode_syncs`), with the debug mode's one-time notice told apart (:func:`is_sync_warning`). The CPU-side
count of the same calls on stand-ins is :mod:`specfamily.testing.syncs`; tests/gpu checks one against the other."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specfamily.testing.syncs import Sync, caller

SYNC_WARNING = "called a synchronizing CUDA operation"  # torch.cuda's debug mode, at each flagged call (c10/cuda)
DEBUG_MODE_NOTICE = "Synchronization debug mode is a prototype feature"  # once a process: no synchronisation
_HERE = str(Path(__file__).resolve())


class CudaSyncOps(TorchDispatchMode):
    """On a CUDA machine: which aten ops torch.cuda's sync debug mode flagged while the code inside ran, each with
    the caller's file:line (``syncs``, kind ``"cuda"``); a flagged call outside any aten op is listed as op
    ``"(outside aten)"``. For tracing what :class:`SyncCounter` may not model (tests/gpu, benchmarks/gpu_check.sh).
    ``notices``: the debug mode's one-time notice, when this count got it (not counted: :func:`is_sync_warning`)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[Sync] = []
        self.notices: list[str] = []

    def __enter__(self):
        self._outer = warnings.catch_warnings(record=True)
        self._caught = self._outer.__enter__()
        warnings.simplefilter("always")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            self._outer.__exit__(None, None, None)
            for w in self._caught:  # flagged outside any op: counted; the others go on to the caller's filters
                if is_sync_warning(w.message):
                    self.syncs.append(Sync("cuda", "(outside aten)", f"{w.filename}:{w.lineno}"))
                    continue
                if DEBUG_MODE_NOTICE in str(w.message):
                    self.notices.append(str(w.message))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    @property
    def count(self) -> int:
        return len(self.syncs)

    def __repr__(self) -> str:
        return f"{self.count} synchronisation(s): {[str(sync) for sync in self.syncs]}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = func(*args, **(kwargs or {}))
        flagged = [w for w in caught if is_sync_warning(w.message)]
        self.syncs += [Sync("cuda", str(func), caller(_HERE)) for _ in flagged]
        for w in caught:  # everything else goes on to the code's own filters
            if w not in flagged:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return out


def is_sync_warning(message: Warning | str) -> bool:
    """Whether a warning is torch.cuda's sync debug mode flagging a synchronising call (c10's warn_or_error_on_sync:
    "called a synchronizing CUDA operation"). Not the notice the first ``set_sync_debug_mode`` of a process warns
    (torch/csrc/cuda/Module.cpp, TORCH_WARN_ONCE: "... does not yet detect all synchronizing operations"): a filter
    on "synchronizing" took it for a flagged call, one more in the first count of each process (session 15's 2)."""
    return SYNC_WARNING in str(message)


def debug_mode_syncs(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """On a CUDA machine: fn()'s result and the file:line of each call torch.cuda's sync debug mode flagged while it
    ran, with no dispatch mode in between (tests/gpu counts with it; :class:`CudaSyncOps` names the ops)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result, [f"{w.filename}:{w.lineno}" for w in caught if is_sync_warning(w.message)]
