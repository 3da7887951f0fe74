"""Token arrays for zoo training: documents joined by end-of-text (windows: ``specfamily.train.tokens``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerFast

from specfamily.io.files import write_atomically
from specfamily.recipes.corpus import Document

EOS_ID = 0


def encode_documents(tokenizer: PreTrainedTokenizerFast, docs: Sequence[Document]) -> np.ndarray:
    """All documents as one uint16 stream, each followed by end-of-text."""
    encoded = tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]
    pieces = [np.asarray(ids + [EOS_ID], dtype=np.uint16) for ids in encoded]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)


def save_tokens(tokens: np.ndarray, path: Path) -> None:
    write_atomically(path, lambda tmp: np.save(tmp, tokens))
