"""Atomic writes: a file or folder is written under a temporary name next to its place, then renamed into it,
so a reader never sees half of one and a failure leaves the old one (or nothing) behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _shareable(path: Path, directory: bool = False) -> None:
    """mkstemp/mkdtemp make private entries; give them the modes a plain open/mkdir would (umask applied)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def write_atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path`` (same suffix), then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        _shareable(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomically(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_folder_atomically(folder: str | Path, fill: Callable[[Path], None]) -> Path:
    """Call ``fill(tmp)`` on a fresh temporary sibling folder, then swap it in place of ``folder``.

    An existing ``folder`` is moved aside first and removed once the new one is in place.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        fill(tmp)
        for entry in [tmp, *tmp.rglob("*")]:  # some writers (safetensors) make private files too
            _shareable(entry, directory=entry.is_dir())
        _swap_in(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _swap_in(new: Path, folder: Path) -> None:
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
        os.replace(folder, old / folder.name)
    os.replace(new, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
