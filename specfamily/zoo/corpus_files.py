"""The zoo corpus's files: which ``.py`` files under a root it reads, in which order, and its held-out split.

One definition for the corpus recipe (``specfamily.recipes.corpus``) and for what REST builds on first use
(``specfamily.drafters.rest.default_store``), which sits below the recipes and cannot import them."""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from pathlib import Path

EXCLUDED_DIRS = ("site-packages", "dist-packages")


def default_root() -> Path:
    """The running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str, heldout_percent: float = 2.0) -> bool:
    """Stable by-file split: a hash of the relative path, independent of the Python build."""
    bucket = int(hashlib.sha1(relative_path.encode()).hexdigest()[:8], 16) % 10000
    return bucket < heldout_percent * 100


def corpus_files(root: Path, suffix: str = ".py") -> Iterator[tuple[str, str | None]]:
    """(relative path, text or None where unreadable) of every ``suffix`` file under ``root`` outside installed
    packages, in sorted relative-path order."""
    files = [p for p in root.rglob(f"*{suffix}")
             if p.is_file() and not any(part in EXCLUDED_DIRS for part in p.relative_to(root).parts)]
    for path in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            text = None
        yield path.relative_to(root).as_posix(), text
