"""Token sequences in one small file: the text a shipped datastore is built from (``build_datastore`` reads them).

A safetensors file with ``tokens`` (every sequence back to back: uint16 when every id fits, else int32) and
``lengths`` (int64, one per sequence), and in its metadata where they came from. Small enough to ship in the
package (two bytes a token), so a clean clone builds the same datastore without regenerating the text.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file


def write_token_file(sequences: Iterable[list[int]], path: str | os.PathLike, source: str) -> Path:
    """Write ``sequences`` (non-negative token ids) to ``path``; returns it."""
    chunks = [np.asarray(seq, dtype=np.int64) for seq in sequences]
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    if tokens.size and tokens.min() < 0:
        raise ValueError("token ids must be >= 0")
    dtype = np.uint16 if not tokens.size or tokens.max() <= np.iinfo(np.uint16).max else np.int32
    lengths = np.array([len(chunk) for chunk in chunks], dtype=np.int64)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({"tokens": tokens.astype(dtype), "lengths": lengths}, str(out),
              metadata={"source": source, "sequences": str(len(chunks)), "tokens": str(int(tokens.size))})
    return out


def read_token_file(path: str | os.PathLike) -> list[list[int]]:
    """The sequences :func:`write_token_file` wrote, in order."""
    arrays = load_file(str(path))
    tokens, lengths = arrays["tokens"].astype(np.int64), arrays["lengths"]
    if int(lengths.sum()) != len(tokens):
        raise ValueError(f"{path}: lengths sum to {int(lengths.sum())}, but it holds {len(tokens)} tokens")
    ends = np.cumsum(lengths)
    return [chunk.tolist() for chunk in np.split(tokens, ends[:-1])] if len(lengths) else []


def token_file_source(path: str | os.PathLike) -> str:
    """Where the file's tokens came from (its metadata)."""
    with safe_open(str(path), "np") as handle:
        return (handle.metadata() or {}).get("source", "")


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of the file, hex: names the datastore built from it, so a changed file is built anew."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
