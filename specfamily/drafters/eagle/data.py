"""Training data for the EAGLE drafter: a token stream from a zoo token array or any HF dataset, cut into windows.

Features are not stored: the trainer runs the frozen target on each window. Sources:
- ``tokens``: a ``.npy`` token array (the zoo corpus ``train.npy``: documents joined by end-of-text), read only;
- ``dataset``: anything ``datasets.load_dataset`` opens (a hub name, ``json``/``text``/``parquet`` with
  ``data_files``, or a local folder), tokenized with the target's tokenizer, documents joined by EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class TokenData:
    """Training and held-out token streams (1-D integer arrays)."""

    train: np.ndarray
    heldout: np.ndarray


def load_token_array(path: str | Path) -> np.ndarray:
    """A 1-D integer token array from a ``.npy`` file, memory-mapped (the file is only read)."""
    array = np.load(path, mmap_mode="r")
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path}: expected a 1-D integer token array, got {array.dtype} of shape {array.shape}")
    return array


def dataset_tokens(
    name: str, tokenizer, data_files: list[str] | None = None, split: str = "train",
    text_field: str = "text", max_documents: int = 0, eos_token_id: int | None = None,
) -> np.ndarray:
    """Tokenize the ``text_field`` of a datasets split into one stream, each document followed by EOS."""
    from datasets import load_dataset

    if tokenizer is None:
        raise ValueError("training from a text dataset needs the target's tokenizer; this target has none")
    dataset = load_dataset(name, data_files=data_files or None, split=split)
    if text_field not in dataset.column_names:
        raise ValueError(f"dataset {name!r} has no field {text_field!r} (fields: {', '.join(dataset.column_names)})")
    if max_documents > 0:
        dataset = dataset.select(range(min(max_documents, len(dataset))))
    suffix = [] if eos_token_id is None else [eos_token_id]
    pieces = [np.asarray(ids + suffix, dtype=np.int64)
              for ids in tokenizer(dataset[text_field], add_special_tokens=False)["input_ids"]]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def split_heldout(tokens: np.ndarray, fraction: float) -> TokenData:
    """The last ``fraction`` of the stream as held-out data."""
    if not 0 < fraction < 1:
        raise ValueError(f"heldout fraction must be in (0, 1), got {fraction}")
    cut = int(len(tokens) * (1 - fraction))
    return TokenData(tokens[:cut], tokens[cut:])


def random_windows(tokens: np.ndarray, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length) long windows at uniformly random offsets."""
    if len(tokens) <= length:
        raise ValueError(f"token stream of {len(tokens)} tokens is too short for windows of {length}")
    starts = torch.randint(0, len(tokens) - length, (batch,), generator=generator).tolist()
    return torch.from_numpy(np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts]))


def fixed_windows(tokens: np.ndarray, count: int, length: int) -> torch.Tensor:
    """(count, length) long evenly spaced, non-overlapping windows (a stable held-out set)."""
    available = len(tokens) // length
    if available == 0:
        raise ValueError(f"token stream of {len(tokens)} tokens is too short for windows of {length}")
    picks = np.linspace(0, available - 1, num=min(count, available)).astype(int)
    return torch.from_numpy(np.stack([np.asarray(tokens[i * length : (i + 1) * length], dtype=np.int64)
                                      for i in picks]))
