"""Reading a resumable training state safely: tensors and plain containers only, never code."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch


def read_state(path: Path) -> dict:
    """A saved training state, tensors and plain containers only: anything else in the file is refused unrun."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"refusing to resume from {str(path)!r}: it holds objects other than tensors and plain "
                         f"containers, which loading would have to run as code ({err}); delete it or use another "
                         "--ckpt") from None
