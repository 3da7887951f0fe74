"""The streaming matmul kernel (``csrc/stream_linear.cpp``): built on first use, cached, or why it is not.

``stream_kernel()`` compiles the C++ sources (``csrc/*.cpp``) with ``torch.utils.cpp_extension.load`` (the
machine's C++ compiler and ninja) into the user's cache (``$SPECFAMILY_CACHE``, ``$XDG_CACHE_HOME/specfamily`` or
``~/.cache/specfamily``, under ``kernels/``, one folder per sources' text and location, flags, CPU, torch and Python
version), one process at a time (a file lock), and memoises the result for the process.

The kernel multiplies a packed copy of each weight (panels of 16 output rows, input-major), made on the weight's
first product and kept on the weight object (attribute ``PACKED_ATTR``): one more copy of every weight it
multiplies, the memory cost of reading each weight as one sequential stream. The copy is remade when the weight's
storage, shape, strides or version counter change, or when one of 64 of its elements (4 runs of 16, rows first to
last), sampled when it was packed, changed: a write through ``.data`` (``w.data.copy_(new)``, or a write to a
tensor bound with ``w.data = t``) moves a version counter of its own, so only the samples see it; such a write
that changes none of them (a few elements) is seen after ``drop_packed``. The copy is not in ``state_dict()``
(which detaches); ``drop_packed`` frees it. Inference tensors count no versions, so a write would go unseen: they
are packed anew for each product (correct, and slower; auto's timing sees it).

Every row count goes through the kernel's own products (16 rows at a time; no BLAS past some count), each output
one sum in the same order: a row's bits do not depend on the rows multiplied with it (batch-invariant), on each
instruction set (``avx512``, ``avx2``, or the ``scalar`` loop where neither runs).

When it cannot build (no compiler, no ninja, a compile error, or ``SPECFAMILY_NO_KERNEL`` set) it logs one warning
naming why and says so in ``StreamKernel.reason``; the matmul kinds then fall back to ``exact`` and ``skinny``
(``specfamily.runtime.matmul``), BLAS's products, which are not batch-invariant (``MatmulChoice.note`` says so).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["DISABLE_ENV", "PACKED_ATTR", "Extension", "KernelUnavailable", "StreamKernel", "build_extension",
           "build_source", "drop_packed", "kernel_headers", "kernel_source", "kernel_sources", "load_extension",
           "packed_bytes", "short_error", "stream_kernel"]

logger = logging.getLogger(__name__)

DISABLE_ENV = "SPECFAMILY_NO_KERNEL"  # set (non-empty, not "0"): never build, use the existing kinds
NAME = "specfamily_stream_linear"
PACKED_ATTR = "_specfamily_packed"  # the weight object's attribute: (key, packed copy, samples); csrc's kPackedAttr
CFLAGS = ("-O3", "-fopenmp")  # OpenMP: at::parallel_for's threads, as torch's own build runs them


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why."""


@dataclass(frozen=True)
class Extension:
    """A built extension (the imported module), or None and the reason it is not available."""

    module: ModuleType | None
    reason: str | None = None

    @property
    def available(self) -> bool:
        return self.module is not None

    @property
    def isa(self) -> str | None:
        """The instruction set the extension runs here (``avx512``, ``avx2``, ``scalar``); None when not built or
        when the extension does not say."""
        return self.module.isa() if self.module is not None and hasattr(self.module, "isa") else None


StreamKernel = Extension  # the stream kernel's record (``module.linear(x, weight, bias=None)``)


def load_extension(disable_env: str, build: Callable[[], ModuleType], log: logging.Logger, what: str,
                   fallback: str) -> Extension:
    """``build()``'s module, or (``disable_env`` set, or any failure) one warning on ``log`` naming why and what runs
    instead: "<what> unavailable (<reason>): <fallback>"; the reason is kept on the record."""
    try:
        if os.environ.get(disable_env, "") not in ("", "0"):
            raise KernelUnavailable(f"{disable_env} is set")
        return Extension(build())
    except Exception as error:  # a compiler's or loader's failure of any kind: fall back, never crash a run
        reason = short_error(error)
        log.warning("%s unavailable (%s): %s", what, reason, fallback)
        log.debug("%s build failure", what, exc_info=True)
        return Extension(None, reason)


def kernel_source() -> Path:
    """The C++ source that defines the module, shipped inside the package."""
    return Path(__file__).resolve().parent / "csrc" / "stream_linear.cpp"


def kernel_sources(source: Path | None = None) -> list[Path]:
    """Every C++ file the module is built from: ``source`` (``kernel_source()``) and the other ``.cpp`` beside it."""
    source = source or kernel_source()
    return [source, *sorted(p for p in source.parent.glob("*.cpp") if p != source)]


def kernel_headers(source: Path) -> list[Path]:
    """The headers ``source`` may include, for its build's key (a change to one builds anew): those beside it and the
    ones every kernel may share (``csrc/cpu_isa.h``: instruction-set detection; ``csrc/stream_api.h``: the stream
    kernel's products for another extension; ``csrc/pass_marks.h``: timestamps a benchmark's build turns on).
    Raises ``KernelUnavailable`` when one of those is missing."""
    csrc = Path(__file__).resolve().parent / "csrc"
    shared = [csrc / "cpu_isa.h", csrc / "stream_api.h", csrc / "pass_marks.h"]
    missing = next((header for header in shared if not header.is_file()), None)
    if missing is not None:
        raise KernelUnavailable(f"the kernels' header {missing} is missing from the installed package")
    beside = sorted(source.parent.glob("*.h"))
    return [*beside, *(header for header in shared if header not in beside)]


@functools.cache
def stream_kernel() -> Extension:
    """The kernel, built (or loaded from the cache) once per process; on failure one warning and the reason."""
    return load_extension(DISABLE_ENV, build_kernel, logger, "matmul 'stream'", "using the 'exact' and 'skinny' kinds")


@functools.cache
def build_kernel(verbose: bool = False) -> ModuleType:
    """Compile (or reuse the cached build of) the extension and import it, once per process; raises
    ``KernelUnavailable`` or the build's own error."""
    source = kernel_source()
    if not source.is_file():
        _check_tools()
        raise KernelUnavailable(f"the kernel source {source} is missing from the installed package")
    return build_extension(NAME, kernel_sources(source), build_folder(source), verbose)


def build_extension(name: str, sources: list[Path], folder: Path, verbose: bool = False) -> ModuleType:
    """Compile (or reuse the build in ``folder``) the extension ``name`` from ``sources`` and import it, one process
    at a time (a file lock beside the folder); the stream kernel's build, and any other extension's built the same
    way (``specfamily.runtime.native_layers``). Raises ``KernelUnavailable`` or the build's own error."""
    _check_tools()
    from filelock import FileLock
    from torch.utils import cpp_extension

    missing = next((source for source in sources if not source.is_file()), None)
    if missing is not None:
        raise KernelUnavailable(f"the kernel source {missing} is missing from the installed package")
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        (folder / "lock").unlink(missing_ok=True)  # torch's own baton, left behind by a build that was killed
        return cpp_extension.load(name=name, sources=[str(path) for path in sources], extra_cflags=list(CFLAGS),
                                  extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=verbose)


def build_source(name: str, source: Path, prefix: str, what: str, verbose: bool = False,
                 headers: tuple[str, ...] | None = None) -> ModuleType:
    """Compile (or reuse the cached build of) the one-source extension ``name`` from ``source`` and import it, its
    build folder ``<prefix>-<digest>`` (:func:`build_folder`). ``headers``: the files beside ``source`` it includes,
    checked present and, with every header beside it and the shared ``cpu_isa.h`` (:func:`kernel_headers`), in the
    build's key; None: it includes none of the kernels' headers. Raises ``KernelUnavailable`` naming ``what`` and a
    missing file, or the build's own error."""
    missing = next((p for p in (source, *(source.with_name(h) for h in headers or ())) if not p.is_file()), None)
    if missing is not None:
        raise KernelUnavailable(f"the {what}'s file {missing} is missing from the installed package")
    keyed = [source] if headers is None else [source, *kernel_headers(source)]
    return build_extension(name, [source], build_folder(source, keyed, prefix), verbose)


def build_folder(source: Path, sources: list[Path] | None = None, prefix: str = "stream_linear") -> Path:
    """``<cache>/kernels/<prefix>-<digest>``: the digest of the sources (``sources``, by default every ``.cpp`` beside
    ``source`` and its ``kernel_headers``), the folder they lie in, the flags, the CPU, torch and Python: any change to
    one of them builds anew. The folder is in the key because the build's ninja file names the sources by absolute
    path: two checkouts sharing one build folder would rebuild it in turn, each waiting on the other's lock."""
    sources = sources or [*kernel_sources(source), *kernel_headers(source)]
    texts = [f"{p.name}\n{p.read_text(encoding='utf-8')}" for p in sources]
    where = str(source.resolve().parent)
    key = "\n".join((*texts, where, " ".join(CFLAGS), cpu_identity(), torch.__version__, sys.version))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return _cache_root() / "kernels" / f"{prefix}-{digest}"


def cpu_identity() -> str:
    """The machine and, where ``/proc/cpuinfo`` says, the CPU's model and flags: what a build is keyed on."""
    found: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        wanted = ("model name", "flags", "Features", "CPU part")  # x86's names, and ARM's
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            name = line.split(":", 1)[0].strip()
            if name in wanted:
                found.setdefault(name, line.strip())  # the first CPU's
    return "\n".join([platform.machine(), platform.processor(), *found.values()])


def packed_bytes(weights: Iterable[torch.Tensor]) -> int:
    """Bytes held by the packed copies kept on ``weights`` (each counted once)."""
    seen = {id(packed): packed for w in weights if (packed := _packed(w)) is not None}
    return sum(p.numel() * p.element_size() for p in seen.values())


def drop_packed(weights: Iterable[torch.Tensor]) -> None:
    """Free the packed copies kept on ``weights`` (the next stream product of one packs it again)."""
    for weight in weights:
        weight.__dict__.pop(PACKED_ATTR, None)


def _packed(weight: torch.Tensor) -> torch.Tensor | None:
    entry = weight.__dict__.get(PACKED_ATTR)
    return entry[1] if entry is not None else None


def _check_tools() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C++ compiler ({compiler!r} is not on PATH)")
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available():
        raise KernelUnavailable("ninja is not installed (pip install ninja)")


def _cache_root() -> Path:
    if os.environ.get("SPECFAMILY_CACHE"):
        return Path(os.environ["SPECFAMILY_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "specfamily"


def short_error(error: BaseException, limit: int = 200) -> str:
    """The error's first non-empty line, clipped: what the warning names."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
