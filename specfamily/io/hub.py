"""Weights named on the model hub: ``weights="owner/name"`` (not an existing folder) is downloaded once into
``huggingface_hub``'s cache; only what a drafter checkpoint holds is fetched (configs and weight files).
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.bin", "*.pt")


def is_hub_name(source: object) -> bool:
    """True for a string shaped ``owner/name`` that is not an existing path."""
    return isinstance(source, str) and bool(HUB_NAME.fullmatch(source)) and not Path(source).exists()


def resolve_source(source: str | Path) -> Path:
    """A folder for ``source``: a hub name is downloaded (once, into the hub's cache); anything else is a path."""
    if not is_hub_name(source):
        return Path(source)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=str(source), allow_patterns=list(CHECKPOINT_FILES)))
    except Exception as error:  # offline, unknown repo, gated: one line saying which name and why
        first = (str(error).splitlines() or [""])[0]
        raise FileNotFoundError(f"{source!r} is neither a folder here nor downloadable from the model hub "
                                f"({type(error).__name__}: {first})") from error
