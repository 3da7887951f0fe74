"""Peak memory of one request: max allocated on CUDA, peak resident set size (RSS) on the CPU.

On CUDA the allocator's peak counter is reset when the request starts. On Linux the kernel's RSS high-water mark
(``VmHWM``) is reset the same way (``/proc/self/clear_refs``, value 5), so the peak is this request's; where that
is not possible the process's lifetime peak (``ru_maxrss``) is reported and labelled so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

CUDA_ALLOCATED = "cuda_max_allocated"  # torch.cuda.max_memory_allocated since the request started
RSS_PEAK = "rss_peak"  # the process's peak RSS since the request started (VmHWM, reset at the start)
RSS_PROCESS_PEAK = "rss_process_peak"  # the process's peak RSS since it started (could not be reset)

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


@dataclass
class PeakMemory:
    """The peak-memory counter of one request on ``device``; ``start`` resets it, ``read`` returns the peak."""

    device: torch.device
    kind: str

    @classmethod
    def start(cls, device: torch.device | str) -> PeakMemory:
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            return cls(device, CUDA_ALLOCATED)
        return cls(device, RSS_PEAK if _reset_rss_peak() else RSS_PROCESS_PEAK)

    def read(self) -> int:
        """The peak in bytes."""
        if self.kind == CUDA_ALLOCATED:
            return int(torch.cuda.max_memory_allocated(self.device))
        if self.kind == RSS_PEAK:
            peak = _status_kib("VmHWM")
            if peak is not None:
                return peak * 1024
        return _process_peak_rss()


def _reset_rss_peak() -> bool:
    """Reset the kernel's RSS high-water mark of this process; False where the kernel does not offer it."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def _status_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (None when unreadable)."""
    try:
        lines = _STATUS.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def _process_peak_rss() -> int:
    """The process's lifetime peak RSS in bytes (``ru_maxrss``: KiB on Linux)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
