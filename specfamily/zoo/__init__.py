"""The zoo: the project's own small model family and held-out prompt sets, shipped as package data.

``zoo_path("zoo:code-target")`` is the folder of a shipped Hugging Face model;
``prompt_set_path("complete")`` is a shipped jsonl prompt set. Nothing is loaded at import time.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path

ZOO_PREFIX = "zoo:"
ZOO_NAMES = ("code-target", "code-draft", "code-medusa", "code-eagle")
PROMPT_SETS = ("complete", "continue")

__all__ = ["PROMPT_SETS", "ZOO_NAMES", "ZOO_PREFIX", "is_zoo_name", "prompt_set_path", "zoo_path"]


def is_zoo_name(name: object) -> bool:
    """True for strings of the form ``zoo:<anything>``."""
    return isinstance(name, str) and name.startswith(ZOO_PREFIX)


def _package_dir(*parts: str) -> Path:
    """A folder or file inside the installed ``specfamily.zoo`` package, as a real path."""
    node = resources.files(__name__).joinpath(*parts)
    if not isinstance(node, Path):
        raise FileNotFoundError(
            f"specfamily.zoo is installed as {type(node).__name__}, not as files on disk; "
            "install specfamily as a regular (unzipped) package to use the zoo"
        )
    return node


def _unknown(kind: str, name: str, bare: str, known: tuple[str, ...], prefix: str = "") -> ValueError:
    close = difflib.get_close_matches(bare, known, n=1, cutoff=0.6)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
    listing = ", ".join(prefix + k for k in known)
    return ValueError(f"unknown {kind} {name!r}{hint} (known: {listing})")


def zoo_path(name: str) -> Path:
    """The shipped HF folder of a zoo model, given ``"zoo:code-target"`` or ``"code-target"``."""
    if not isinstance(name, str):
        raise TypeError(f"zoo model name must be a string, got {type(name).__name__}")
    bare = name[len(ZOO_PREFIX) :] if is_zoo_name(name) else name
    if bare not in ZOO_NAMES:
        raise _unknown("zoo model", name, bare, ZOO_NAMES, prefix=ZOO_PREFIX)
    folder = _package_dir("weights", bare)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"zoo model {ZOO_PREFIX + bare!r} is not shipped with this installation (no {folder / 'config.json'}); "
            "train and export it with `specfamily-zoo train` (see ZOO.md)"
        )
    return folder


def prompt_set_path(name: str) -> Path:
    """The shipped jsonl file of a held-out prompt set (``"complete"`` or ``"continue"``)."""
    if not isinstance(name, str):
        raise TypeError(f"prompt set name must be a string, got {type(name).__name__}")
    if name not in PROMPT_SETS:
        raise _unknown("zoo prompt set", name, name, PROMPT_SETS)
    path = _package_dir("data", "prompts", f"{name}.jsonl")
    if not path.is_file():
        raise FileNotFoundError(
            f"zoo prompt set {name!r} is not shipped with this installation (no {path}); "
            "build it with `specfamily-zoo prompts --workdir work/zoo --out specfamily/zoo/data/prompts`"
        )
    return path
