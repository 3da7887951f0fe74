"""Build the zoo's tokenizer and token arrays from the corpus into a work folder."""

from __future__ import annotations

import json
from pathlib import Path

from specfamily.recipes.corpus import load_corpus
from specfamily.recipes.data import encode_documents, save_tokens
from specfamily.recipes.tokenizer import save_tokenizer, train_tokenizer


def prepare(workdir: Path, root: Path | None = None, suffix: str = ".py", vocab_size: int = 4096) -> dict:
    """Corpus -> tokenizer/ + train.npy + heldout.npy + corpus.json in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(root, suffix=suffix)
    tokenizer = train_tokenizer((d.text for d in corpus.train), vocab_size=vocab_size)
    fast = save_tokenizer(tokenizer, workdir / "tokenizer")
    train_tokens = encode_documents(fast, corpus.train)
    heldout_tokens = encode_documents(fast, corpus.heldout)
    save_tokens(train_tokens, workdir / "train.npy")
    save_tokens(heldout_tokens, workdir / "heldout.npy")
    meta = corpus.metadata() | {"train_tokens": int(len(train_tokens)), "heldout_tokens": int(len(heldout_tokens))}
    (workdir / "corpus.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta
