"""Training data for Medusa heads: token streams from the zoo corpus or any ``datasets`` source, and
self-distillation windows (the target's own greedy continuations).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

_BUILDERS = {".jsonl": "json", ".json": "json", ".txt": "text", ".csv": "csv", ".parquet": "parquet"}


@dataclass
class TokenData:
    """A training stream and a held-out stream of token ids (documents joined by end-of-text)."""

    train: np.ndarray  # (N,) integer ids
    heldout: np.ndarray  # (M,)
    source: str


def zoo_tokens(zoo_dir: str | Path) -> TokenData:
    """``train.npy`` / ``heldout.npy`` written by ``specfamily-zoo prepare`` (memory-mapped, read only)."""
    folder = Path(zoo_dir)
    files = [folder / "train.npy", folder / "heldout.npy"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"zoo token arrays not found: {missing}; run `specfamily-zoo prepare` first")
    train, heldout = (np.load(f, mmap_mode="r") for f in files)
    return TokenData(train, heldout, f"zoo:{folder}")


def _load_texts(name: str, text_field: str, split: str) -> list[str]:
    from datasets import load_dataset

    path = Path(name)
    if path.exists():
        builder = _BUILDERS.get(path.suffix)
        if builder is None:
            raise ValueError(f"cannot read {path}: known file types are {', '.join(sorted(_BUILDERS))}")
        dataset = load_dataset(builder, data_files=str(path), split="train")
    else:
        dataset = load_dataset(name, split=split)
    if text_field not in dataset.column_names:
        raise ValueError(f"dataset {name!r} has no field {text_field!r}; its fields: {dataset.column_names}")
    return [t for t in dataset[text_field] if t]


def dataset_tokens(name: str, tokenizer, eos_token_id: int, text_field: str = "text", split: str = "train",
                   heldout_fraction: float = 0.05) -> TokenData:
    """Any ``datasets`` source (hub name or local jsonl/txt/csv/parquet), tokenised; the last documents held out."""
    if tokenizer is None:
        raise ValueError("training on a text dataset needs the target's tokenizer (the target has none)")
    texts = _load_texts(name, text_field, split)
    if len(texts) < 2:
        raise ValueError(f"dataset {name!r} has {len(texts)} non-empty texts; need at least 2 (train and held out)")
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    cut = min(len(encoded) - 1, max(1, round(len(encoded) * (1 - heldout_fraction))))

    def join(docs: list[list[int]]) -> np.ndarray:
        return np.concatenate([np.asarray(ids + [eos_token_id], dtype=np.int64) for ids in docs])

    return TokenData(join(encoded[:cut]), join(encoded[cut:]), name)


def greedy_windows(model, windows: torch.Tensor, prompt_len: int, pad_token_id: int = 0) -> torch.Tensor:
    """Self-distillation: keep each window's first ``prompt_len`` tokens, replace the rest by the target's greedy
    continuation, so the heads learn what the target itself will produce. windows (B, T) -> (B, T)."""
    b, t = windows.shape
    if not 0 < prompt_len < t:
        raise ValueError(f"distillation prompt length must be in (0, {t}), got {prompt_len}")
    prefix = windows[:, :prompt_len].to(model.device)
    with torch.no_grad():
        out = model.generate(prefix, attention_mask=torch.ones_like(prefix), do_sample=False,
                             max_new_tokens=t - prompt_len, min_new_tokens=t - prompt_len, pad_token_id=pad_token_id)
    return out[:, :t]
