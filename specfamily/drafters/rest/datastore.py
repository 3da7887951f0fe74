"""REST's datastore: token sequences concatenated (an end marker after each) with their suffix array, on disk.

``build_datastore`` writes ``tokens.npy`` (int32, ``SEPARATOR`` after each sequence), ``suffixes.npy`` (the suffix
array: start positions in lexicographic order of the suffixes, the marker below every token) and ``meta.json``;
``Datastore.open`` memory-maps them, so a datastore is built once and every run after reads only what it touches.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

SEPARATOR = -1  # ends each sequence; no match or continuation crosses it
FORMAT = 1


def suffix_array(data: np.ndarray, progress: bool = False) -> np.ndarray:
    """Start positions of ``data``'s suffixes in lexicographic order (a suffix that ends first sorts first), by prefix
    doubling: O(n log^2 n) in numpy sorts. data: (n,) int; returns (n,) int64."""
    n = len(data)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = data.astype(np.int64) - int(data.min())  # >= 0; past the end is -1, below everything
    span = 1
    bar = tqdm(desc="suffix array", unit="round", disable=not progress)
    while True:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - span] = rank[span:]
        order = np.lexsort((second, rank))
        first_sorted, second_sorted = rank[order], second[order]
        new_group = np.empty(n, dtype=bool)
        new_group[0] = False
        new_group[1:] = (first_sorted[1:] != first_sorted[:-1]) | (second_sorted[1:] != second_sorted[:-1])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.cumsum(new_group)
        bar.update(1)
        if rank.max() == n - 1 or span >= n:
            bar.close()
            return order
        span *= 2


def build_datastore(sequences: Iterable[list[int]], path: str | os.PathLike, vocab_size: int, source: str = "",
                    progress: bool = True) -> Path:
    """Write a datastore of ``sequences`` (token ids < ``vocab_size``) to the folder ``path``; returns it.

    Atomic: written into a sibling folder that then replaces ``path``, so an interrupted build leaves nothing half
    written there (the old datastore, if any, or none); when another process finished the same folder first, its
    datastore is kept."""
    folder = Path(path)
    chunks, count = [], 0
    for seq in tqdm(sequences, desc="datastore", unit="seq", disable=not progress):
        ids = np.asarray(seq, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"sequence {count} has token ids outside [0, {vocab_size})")
        chunks += [ids.astype(np.int32), np.array([SEPARATOR], dtype=np.int32)]
        count += 1
    data = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    suffixes = suffix_array(data, progress).astype(np.int32 if len(data) < 2**31 else np.int64)
    meta = {"format": FORMAT, "vocab_size": vocab_size, "sequences": count, "tokens": int(len(data) - count),
            "source": source}
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    try:
        np.save(partial / "tokens.npy", data)
        np.save(partial / "suffixes.npy", suffixes)
        (partial / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        _replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _replace(partial: Path, folder: Path) -> None:
    """Move the complete ``partial`` folder to ``folder``, replacing what was there."""
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        os.replace(folder, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(partial, folder)
    except OSError:
        if not (folder / "meta.json").is_file():  # not a datastore another build just finished
            raise


@dataclass
class Datastore:
    """A memory-mapped datastore: tokens (N,) with end markers, suffixes (N,) their suffix array, its meta."""

    tokens: np.ndarray
    suffixes: np.ndarray
    vocab_size: int
    path: Path | None = None

    @classmethod
    def open(cls, path: str | os.PathLike) -> Datastore:
        folder = Path(path)
        meta_file = folder / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"no REST datastore at {folder} (meta.json missing): build it with "
                                    "python -m specfamily.recipes.rest_datastore or rest.datastore.build_datastore")
        meta = json.loads(meta_file.read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"datastore {folder} has format {meta.get('format')!r}; this version reads {FORMAT}")
        tokens = np.load(folder / "tokens.npy", mmap_mode="r")
        suffixes = np.load(folder / "suffixes.npy", mmap_mode="r")
        return cls(tokens, suffixes, int(meta["vocab_size"]), folder)

    def occurrences(self, query: list[int]) -> np.ndarray:
        """Start positions of every occurrence of ``query`` (in suffix order); (m,) int64."""
        data, size = self.tokens, len(query)

        def key(start) -> list[int]:
            return data[start : start + size].tolist()

        lo = bisect.bisect_left(self.suffixes, query, key=key)
        hi = bisect.bisect_right(self.suffixes, query, lo=lo, key=key)
        return np.asarray(self.suffixes[lo:hi], dtype=np.int64)

    def longest_match(self, context: list[int], min_span: int, max_span: int) -> tuple[int, np.ndarray]:
        """(span, positions): the longest suffix of ``context`` of min_span..max_span tokens that occurs, with its
        occurrences (a longer suffix occurs only where a shorter one does: a binary search over spans); (0, empty)."""
        lo, hi = min_span, min(max_span, len(context))
        found: tuple[int, np.ndarray] = (0, np.zeros(0, dtype=np.int64))
        while lo <= hi:
            span = (lo + hi) // 2
            positions = self.occurrences(context[-span:])
            if len(positions):
                found, lo = (span, positions), span + 1
            else:
                hi = span - 1
        return found
