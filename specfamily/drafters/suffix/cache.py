"""The global suffix cache: earlier requests' token sequences in one suffix index, bounded by a token budget.

Adding a sequence past ``max_tokens`` evicts the oldest until it fits (one longer than the budget keeps its last
``max_tokens`` tokens). Evicted counts leave the index at once; the index is rebuilt from the live sequences once the
evicted tokens outnumber the live ones. Files hold the sequences, not the index: JSON (``.json``) or safetensors,
written atomically; a file that is not a suffix cache, or holds bad token ids, is a ``ValueError`` naming it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specfamily.drafters.suffix.automaton import SuffixIndex
from specfamily.drafters.suffix.tree import check_depth, check_tokens
from specfamily.io.files import write_atomically, write_text_atomically

FORMAT = "specfamily-suffix-cache"
VERSION = 1


@dataclass
class GlobalCache:
    """Earlier requests' sequences (oldest first) and the suffix index over them."""

    max_depth: int = 64
    max_tokens: int = 65536
    sequences: deque[list[int]] = field(default_factory=deque)
    tokens: int = 0  # total length of ``sequences``
    evicted: int = 0  # tokens evicted since the index was last built from the live sequences
    index: SuffixIndex = field(init=False)

    def __post_init__(self) -> None:
        check_depth(self.max_depth)
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"max_cached_tokens must be an integer >= 0, got {self.max_tokens!r}")
        self.index = SuffixIndex(self.max_depth)
        kept, self.sequences, self.tokens = list(self.sequences), deque(), 0
        for sequence in kept:
            self.add(sequence)

    def add(self, sequence: Iterable[int]) -> None:
        """Insert one request's tokens, evicting the oldest sequences beyond the budget."""
        sequence = check_tokens(sequence, "sequence")
        if self.max_tokens == 0 or not sequence:
            return
        sequence = sequence[-self.max_tokens :]
        while self.sequences and self.tokens + len(sequence) > self.max_tokens:
            oldest = self.sequences.popleft()
            self.tokens -= len(oldest)
            self.index.remove(oldest)
            self.evicted += len(oldest)
        if self.evicted > self.tokens:
            self.rebuild()
        self.index.insert(sequence)
        self.sequences.append(sequence)
        self.tokens += len(sequence)

    def rebuild(self) -> None:
        """A fresh index over the live sequences (drops the states only evicted sequences held)."""
        self.index, self.evicted = SuffixIndex(self.max_depth), 0
        for sequence in self.sequences:
            self.index.insert(sequence)

    def clear(self) -> None:
        self.sequences.clear()
        self.tokens = self.evicted = 0
        self.index = SuffixIndex(self.max_depth)

    def save(self, path: str | Path) -> Path:
        """Write the sequences to ``path`` atomically: JSON for ``.json``, safetensors otherwise."""
        path = Path(path)
        if path.suffix == ".json":
            text = json.dumps({"format": FORMAT, "version": VERSION, "sequences": list(self.sequences)})
            return write_text_atomically(path, text)
        from safetensors.torch import save_file

        flat = [token for sequence in self.sequences for token in sequence]
        tensors = {"tokens": torch.tensor(flat, dtype=torch.int64),
                   "lengths": torch.tensor([len(s) for s in self.sequences], dtype=torch.int64)}
        metadata = {"format": FORMAT, "version": str(VERSION)}
        return write_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))

    def load(self, path: str | Path, vocab_size: int | None = None) -> int:
        """Add the sequences saved in ``path`` (oldest first, within the budget); returns how many were read."""
        sequences = read_sequences(path)
        for i, sequence in enumerate(sequences):
            if vocab_size is not None and any(token >= vocab_size for token in sequence):
                bad = next(token for token in sequence if token >= vocab_size)
                raise ValueError(f"suffix cache {path}: sequence {i} holds token {bad}, outside the target's "
                                 f"vocabulary of {vocab_size}")
        for sequence in sequences:
            self.add(sequence)
        return len(sequences)


def read_sequences(path: str | Path) -> list[list[int]]:
    """The token sequences of a saved cache, checked; a ``ValueError`` naming the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"suffix cache {path} does not exist")
    try:
        sequences = _read_json(path) if path.suffix == ".json" else _read_safetensors(path)
    except ValueError as err:
        raise ValueError(f"suffix cache {path} is not readable: {err}") from None
    return [check_tokens(s, f"suffix cache {path}: sequence {i}") for i, s in enumerate(sequences)]


def _read_json(path: Path) -> list:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file (no format field {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
    sequences = data.get("sequences")
    if not isinstance(sequences, list) or not all(isinstance(s, list) for s in sequences):
        raise ValueError("'sequences' must be a list of lists of token ids")
    return sequences


def _read_safetensors(path: Path) -> list[list[int]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != FORMAT or metadata.get("version") != str(VERSION):
                raise ValueError(f"not a {FORMAT} file of version {VERSION} (metadata {metadata})")
            if set(handle.keys()) != {"tokens", "lengths"}:
                raise ValueError(f"tensors {sorted(handle.keys())}, expected ['lengths', 'tokens']")
            tokens, lengths = handle.get_tensor("tokens"), handle.get_tensor("lengths")
    except SafetensorError as err:
        raise ValueError(f"not a safetensors file ({err})") from None
    if tokens.dtype != torch.int64 or lengths.dtype != torch.int64 or tokens.dim() != 1 or lengths.dim() != 1:
        raise ValueError("'tokens' and 'lengths' must be 1-d int64 tensors")
    if bool((lengths < 0).any()) or int(lengths.sum()) != tokens.numel():
        raise ValueError(f"lengths sum to {int(lengths.sum())} but there are {tokens.numel()} tokens")
    return [chunk.tolist() for chunk in tokens.split(lengths.tolist())]
