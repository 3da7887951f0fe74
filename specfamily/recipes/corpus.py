"""The zoo corpus: the running interpreter's standard-library ``.py`` sources, split by file."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from specfamily.zoo.corpus_files import EXCLUDED_DIRS, corpus_files, default_root, is_heldout  # noqa: F401


@dataclass(frozen=True)
class Document:
    path: str  # relative to the corpus root, '/'-separated
    text: str


@dataclass
class Corpus:
    root: str
    train: list[Document] = field(default_factory=list)
    heldout: list[Document] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # undecodable files

    def file_list_hash(self) -> str:
        """sha256 over the sorted relative paths and contents of every kept file."""
        digest = hashlib.sha256()
        for doc in sorted(self.train + self.heldout, key=lambda d: d.path):
            digest.update(doc.path.encode())
            digest.update(b"\0")
            digest.update(doc.text.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def metadata(self) -> dict:
        return {
            "root": self.root,
            "train_files": [d.path for d in self.train],
            "heldout_files": [d.path for d in self.heldout],
            "skipped_files": self.skipped,
            "sha256": self.file_list_hash(),
            "train_chars": sum(len(d.text) for d in self.train),
            "heldout_chars": sum(len(d.text) for d in self.heldout),
        }


def load_corpus(root: Path | None = None, suffix: str = ".py", heldout_percent: float = 2.0) -> Corpus:
    """Read every ``suffix`` file under ``root`` (default: the stdlib) in a deterministic order."""
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        raise ValueError(f"corpus root {root} is not a directory")
    corpus = Corpus(root=str(root))
    for relative, text in corpus_files(root, suffix):
        if text is None:
            corpus.skipped.append(relative)
            continue
        if not text.strip():
            continue
        split = corpus.heldout if is_heldout(relative, heldout_percent) else corpus.train
        split.append(Document(relative, text))
    if not corpus.train:
        raise ValueError(f"no readable {suffix} files under {root}")
    return corpus
