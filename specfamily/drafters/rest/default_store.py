"""The datastore a zoo target's ``rest`` uses when given none: built on first use, once, from the zoo corpus.

The text is the zoo corpus's training split (the running interpreter's standard-library ``.py`` files, the held-out
2% by path hash left out: ``specfamily.zoo.corpus_files``, which the corpus recipe reads through too), tokenized
with the target's tokenizer up to ``DEFAULT_MAX_TOKENS``: what ``python -m specfamily.recipes.rest_datastore``
builds, in the same place, so either one serves the other.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from specfamily.drafters.rest.datastore import build_datastore
from specfamily.zoo.corpus_files import corpus_files, default_root, is_heldout

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 2_000_000
SOURCE = "zoo corpus (stdlib .py, train split)"


def corpus_texts(root: Path | None = None) -> Iterator[tuple[str, str]]:
    """(relative path, text) of the zoo corpus's training files, in the corpus's order (sorted paths)."""
    for relative, text in corpus_files(Path(root) if root is not None else default_root()):
        if text is not None and text.strip() and not is_heldout(relative):
            yield relative, text


def token_sequences(texts: Iterator[str], tokenizer, max_tokens: int) -> Iterator[list[int]]:
    """Each text's token ids (no special tokens), until ``max_tokens`` are given."""
    given = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False).input_ids[: max_tokens - given]
        given += len(ids)
        yield ids
        if given >= max_tokens:
            return


def build_default(folder: Path, tokenizer, vocab_size: int, max_tokens: int = DEFAULT_MAX_TOKENS,
                  progress: bool = True) -> Path:
    """Build the default datastore at ``folder`` (atomically: see ``build_datastore``)."""
    if tokenizer is None:
        raise ValueError(f"rest builds its datastore at {folder} with the target's tokenizer, and this target has "
                         "none; pass datastore=PATH")
    log.warning("rest: building the datastore for this zoo target at %s (once; %d tokens of the zoo corpus)",
                folder, max_tokens)
    texts = (text for _, text in corpus_texts())
    return build_datastore(token_sequences(texts, tokenizer, max_tokens), folder, vocab_size,
                           source=f"{SOURCE}; {max_tokens} tokens at most", progress=progress)
