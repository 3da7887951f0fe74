"""Sequence-level distillation data for the draft: training-split windows continued by the target's greedy decoding,
so the draft trains on text like what it drafts at decode time (DistillSpec, with teacher-generated text). Windows
come from the training split only.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import LlamaForCausalLM

from specfamily.io.files import write_atomically
from specfamily.train.tokens import greedy_windows, random_windows, token_array


@dataclass
class GreedyDataConfig:
    workdir: str  # holds train.npy
    teacher: str  # HF folder of the target
    out: str  # .npy file of (count, prompt_len + new_tokens) uint16 windows; a .json of the run beside it
    count: int = 2048
    prompt_len: int = 192
    new_tokens: int = 128
    batch: int = 16
    seed: int = 0
    max_minutes: float = 0.0  # 0 = no budget; else stop after the batch that crosses it (fewer windows)


def check_config(cfg: GreedyDataConfig) -> None:
    for name in ("count", "prompt_len", "new_tokens", "batch"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if not cfg.out.endswith(".npy"):
        raise ValueError(f"out must name a .npy file, got {cfg.out!r}")


def make_greedy_data(cfg: GreedyDataConfig) -> dict:
    """Generate the windows batch by batch, then write the array and its record (each atomically)."""
    check_config(cfg)
    tokens = token_array(Path(cfg.workdir) / "train.npy")
    teacher = LlamaForCausalLM.from_pretrained(cfg.teacher, dtype=torch.float32, use_kernels=False).eval()
    if teacher.config.vocab_size > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"a vocabulary of {teacher.config.vocab_size} does not fit the uint16 windows")
    generator = torch.Generator().manual_seed(cfg.seed)
    length = cfg.prompt_len + cfg.new_tokens
    rows: list[torch.Tensor] = []
    made, started = 0, time.perf_counter()
    with tqdm(total=cfg.count, desc="greedy windows", mininterval=10) as bar:
        while made < cfg.count:
            if cfg.max_minutes and time.perf_counter() - started > 60 * cfg.max_minutes:
                break
            size = min(cfg.batch, cfg.count - made)
            windows = random_windows(tokens, size, length - 1, generator)  # (size, length)
            rows.append(greedy_windows(teacher, windows, cfg.prompt_len, pad_token_id=0))
            made += size
            bar.update(size)
    if not rows:
        raise RuntimeError(f"no window was generated within max_minutes={cfg.max_minutes}")
    array = torch.cat(rows).numpy().astype(np.uint16)
    record = {"config": asdict(cfg), "windows": int(array.shape[0]), "length": length,
              "generated_tokens": int(array.shape[0] * cfg.new_tokens), "seconds": time.perf_counter() - started}
    write_atomically(cfg.out, lambda tmp: np.save(tmp, array))
    write_atomically(Path(cfg.out).with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(record, indent=2)))
    return record


def load_greedy_data(path: str | Path, vocab_size: int) -> np.ndarray:
    """The (n, length) windows written by :func:`make_greedy_data`, checked against the model's vocabulary."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"greedy data {str(path)!r} not found; make it with `specfamily-zoo greedy-data`")
    array = np.load(path, mmap_mode="r")
    if array.ndim != 2 or array.shape[1] < 2 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{path}: expected (windows, length >= 2) integer tokens, got {array.dtype} {array.shape}")
    if array.size and int(array.max()) >= vocab_size:
        raise ValueError(f"{path}: token id {int(array.max())} is outside the vocabulary of {vocab_size}")
    return array


def sample_rows(array: np.ndarray, count: int, generator: torch.Generator) -> torch.Tensor:
    """(count, length) long rows drawn uniformly with replacement."""
    picks = torch.randint(0, array.shape[0], (count,), generator=generator).numpy()
    return torch.from_numpy(np.asarray(array[picks], dtype=np.int64))
