"""Token arrays for zoo training: documents joined by end-of-text, random fixed-length windows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from specfamily.zoo.corpus import Document

EOS_ID = 0


def encode_documents(tokenizer: PreTrainedTokenizerFast, docs: Sequence[Document]) -> np.ndarray:
    """All documents as one uint16 stream, each followed by end-of-text."""
    encoded = tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]
    pieces = [np.asarray(ids + [EOS_ID], dtype=np.uint16) for ids in encoded]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)


def save_tokens(tokens: np.ndarray, path: Path) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, tokens)
    tmp.replace(path)


def random_windows(tokens: np.ndarray, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length + 1) windows starting at uniformly random offsets."""
    if len(tokens) <= length + 1:
        raise ValueError(f"token stream of {len(tokens)} is too short for windows of {length + 1}")
    starts = torch.randint(0, len(tokens) - length - 1, (batch,), generator=generator)
    rows = [torch.from_numpy(tokens[s : s + length + 1].astype(np.int64)) for s in starts.tolist()]
    return torch.stack(rows)


def fixed_windows(tokens: np.ndarray, count: int, length: int) -> torch.Tensor:
    """(m, length + 1) evenly spaced, non-overlapping windows for a stable held-out loss."""
    stride = length + 1
    available = len(tokens) // stride
    if available == 0:
        raise ValueError(f"token stream of {len(tokens)} is too short for windows of {stride}")
    picks = np.linspace(0, available - 1, num=min(count, available)).astype(int)
    rows = [torch.from_numpy(tokens[i * stride : (i + 1) * stride].astype(np.int64)) for i in picks]
    return torch.stack(rows)
