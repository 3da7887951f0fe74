"""The datastore a zoo target's ``rest`` uses when given none: built on first use, once, in the specfamily cache.

- A target with shipped chat text (``CHAT_TOKENS``; none today) indexes it: a small token file in this package
  (:mod:`token_file`), e.g. the target's own greedy answers to user turns that are not evaluation prompts, written
  by ``python -m specfamily.recipes.rest_datastore --distill DIR --save-tokens FILE``. SmolLM2's own distilled
  answers were measured as its datastore and did not pay (docs/variants.md), so it keeps the zoo corpus's.
- Any other zoo target indexes the zoo corpus's training split (the running interpreter's standard-library ``.py``
  files, the held-out 2% by path hash left out: ``specfamily.zoo.corpus_files``, which the corpus recipe reads
  through too), tokenized with the target's tokenizer up to ``DEFAULT_MAX_TOKENS``.

``python -m specfamily.recipes.rest_datastore`` builds the same datastores in the same places, so either serves the
other.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from specfamily.drafters.rest.datastore import build_datastore
from specfamily.drafters.rest.token_file import read_token_file, token_file_source
from specfamily.zoo.corpus_files import corpus_files, default_root, is_heldout

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 2_000_000
SOURCE = "zoo corpus (stdlib .py, train split)"
CHAT_TOKENS: dict[str, str] = {}  # zoo target -> a token file shipped beside this module


def shipped_tokens(name: str) -> Path | None:
    """The chat token file shipped for zoo target ``name`` (without the ``zoo:`` prefix), or None."""
    file = CHAT_TOKENS.get(name)
    return None if file is None else Path(__file__).with_name(file)


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
    """Build the zoo corpus's datastore at ``folder`` (atomically: see ``build_datastore``)."""
    if tokenizer is None:
        raise ValueError(f"rest builds its datastore at {folder} with the target's tokenizer, and this target has "
                         "none; pass datastore=PATH")
    log.warning("rest: building the datastore for this zoo target at %s (once; %d tokens of the zoo corpus)",
                folder, max_tokens)
    texts = (text for _, text in corpus_texts())
    return build_datastore(token_sequences(texts, tokenizer, max_tokens), folder, vocab_size,
                           source=f"{SOURCE}; {max_tokens} tokens at most", progress=progress)


def build_shipped(folder: Path, tokens: Path, vocab_size: int, progress: bool = True) -> Path:
    """Build the datastore of a shipped token file at ``folder`` (atomically)."""
    log.warning("rest: building the datastore for this zoo target at %s (once; from %s)", folder, tokens.name)
    return build_datastore(read_token_file(tokens), folder, vocab_size,
                           source=f"{tokens.name}: {token_file_source(tokens)}", progress=progress)
