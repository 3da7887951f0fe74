"""Where the zoo's files lie in the installed package, and the error an unknown name gets."""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path


def package_dir(*parts: str) -> Path:
    """A folder or file inside the installed ``specfamily.zoo`` package, as a real path."""
    node = resources.files("specfamily.zoo").joinpath(*parts)
    if not isinstance(node, Path):
        raise FileNotFoundError(
            f"specfamily.zoo is installed as {type(node).__name__}, not as files on disk; "
            "install specfamily as a regular (unzipped) package to use the zoo"
        )
    return node


def unknown_name(kind: str, name: str, bare: str, known: tuple[str, ...], prefix: str = "") -> ValueError:
    close = difflib.get_close_matches(bare, known, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
    listing = ", ".join(prefix + k for k in known)
    return ValueError(f"unknown {kind} {name!r}{hint} (known: {listing})")
