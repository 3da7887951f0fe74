"""Token streams for training and evaluation: the zoo corpus arrays, any ``datasets`` text source,
fixed-length windows cut from them and windows continued by a model's greedy decoding (used by the zoo trainer
and by every drafter that trains)."""

from __future__ import annotations

import copy
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
    source: str = ""


def token_array(path: str | Path) -> np.ndarray:
    """A 1-D integer token array from a ``.npy`` file, memory-mapped (the file is only read)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"token array {str(path)!r} not found")
    array = np.load(path, mmap_mode="r")
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path}: expected a 1-D integer token array, got {array.dtype} of shape {array.shape}")
    return array


def zoo_tokens(zoo_dir: str | Path) -> TokenData:
    """``train.npy`` / ``heldout.npy`` written by ``specfamily-zoo prepare``."""
    folder = Path(zoo_dir)
    files = [folder / "train.npy", folder / "heldout.npy"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"zoo token arrays not found: {missing}; run `specfamily-zoo prepare` first")
    return TokenData(token_array(files[0]), token_array(files[1]), f"zoo:{folder}")


def _load_texts(name: str, text_field: str, split: str, data_files: list[str] | None, max_documents: int):
    from datasets import load_dataset

    path = Path(name)
    if path.is_file():  # a local file: the builder from its suffix
        builder = _BUILDERS.get(path.suffix)
        if builder is None:
            raise ValueError(f"cannot read {path}: known file types are {', '.join(sorted(_BUILDERS))}")
        dataset = load_dataset(builder, data_files=str(path), split="train")
    else:  # a hub name, a local folder or a builder (json, text, ...) with data_files
        dataset = load_dataset(name, data_files=data_files or None, split=split)
    if text_field not in dataset.column_names:
        raise ValueError(f"dataset {name!r} has no field {text_field!r} (fields: {', '.join(dataset.column_names)})")
    if max_documents > 0:
        dataset = dataset.select(range(min(max_documents, len(dataset))))
    return [t for t in dataset[text_field] if t]


def dataset_tokens(name: str, tokenizer, eos_token_id: int | None, text_field: str = "text", split: str = "train",
                   data_files: list[str] | None = None, max_documents: int = 0) -> np.ndarray:
    """The non-empty ``text_field`` values of a ``datasets`` source tokenised into one stream, each document
    followed by ``eos_token_id``. ``name``: a local jsonl/json/txt/csv/parquet file, a hub name, a local folder,
    or a builder with ``data_files``."""
    if tokenizer is None:
        raise ValueError("training on a text dataset needs the target's tokenizer (the target has none)")
    texts = _load_texts(name, text_field, split, data_files, max_documents)
    suffix = [] if eos_token_id is None else [eos_token_id]
    pieces = [np.asarray(ids + suffix, dtype=np.int64)
              for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def split_heldout(tokens: np.ndarray, fraction: float, source: str = "") -> TokenData:
    """The last ``fraction`` of the stream held out."""
    if not 0 < fraction < 1:
        raise ValueError(f"heldout fraction must be in (0, 1), got {fraction}")
    cut = int(len(tokens) * (1 - fraction))
    if cut == 0 or cut == len(tokens):
        raise ValueError(f"a stream of {len(tokens)} tokens is too short to hold out {fraction:.0%} of it")
    return TokenData(tokens[:cut], tokens[cut:], source)


def random_windows(tokens: np.ndarray, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, length + 1) long windows starting at uniformly random offsets."""
    if len(tokens) <= length + 1:
        raise ValueError(f"token stream of {len(tokens)} is too short for windows of {length + 1}")
    starts = torch.randint(0, len(tokens) - length - 1, (batch,), generator=generator)
    rows = [torch.from_numpy(np.asarray(tokens[s : s + length + 1]).astype(np.int64)) for s in starts.tolist()]
    return torch.stack(rows)


def fixed_windows(tokens: np.ndarray, count: int, length: int) -> torch.Tensor:
    """(m, length + 1) long evenly spaced, non-overlapping windows (a stable held-out set), m <= count."""
    stride = length + 1
    available = len(tokens) // stride
    if available == 0:
        raise ValueError(f"token stream of {len(tokens)} is too short for windows of {stride}")
    picks = np.linspace(0, available - 1, num=min(count, available)).astype(int)
    rows = [torch.from_numpy(np.asarray(tokens[i * stride : (i + 1) * stride]).astype(np.int64)) for i in picks]
    return torch.stack(rows)


def greedy_windows(model, windows: torch.Tensor, prompt_len: int, pad_token_id: int = 0) -> torch.Tensor:
    """Self-distillation data: keep each window's first ``prompt_len`` tokens and replace the rest by the model's
    greedy continuation. windows (B, T) -> (B, T). End-of-text is neither forbidden nor a stop: the model's own
    policy, decoded on past it, so the tail is what the model would produce (no forced-length bias). The model's
    generation config is swapped for the call: not re-entrant for one model across threads."""
    b, t = windows.shape
    if not 0 < prompt_len < t:
        raise ValueError(f"distillation prompt length must be in (0, {t}), got {prompt_len}")
    prefix = windows[:, :prompt_len].to(model.device)
    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    model.generation_config.eos_token_id = None  # decode exactly t - prompt_len tokens
    try:
        with torch.no_grad():
            out = model.generate(prefix, attention_mask=torch.ones_like(prefix), do_sample=False,
                                 max_new_tokens=t - prompt_len, pad_token_id=pad_token_id)
    finally:
        model.generation_config = saved
    return out[:, :t].to(windows.device)
