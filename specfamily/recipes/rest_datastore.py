"""A REST datastore for a target: ``python -m specfamily.recipes.rest_datastore [--target zoo:smollm2] [--out DIR]``.

Default text: the zoo corpus's training split (the standard library's Python sources, :mod:`corpus`), never an
evaluation prompt set: what a zoo target's rest builds on first use. ``--dataset`` takes any ``datasets`` corpus
instead (``--dataset json --data-files F.jsonl --field text``). Tokenized with the target's tokenizer up to
``--max-tokens`` and written where the rest drafter finds it for a zoo target (``<specfamily cache>/rest/<name>``)
unless ``--out`` says otherwise; built once (atomically), reused.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from specfamily.core.target import load_target
from specfamily.drafters.rest import default_store
from specfamily.drafters.rest.datastore import build_datastore
from specfamily.drafters.rest.default_store import DEFAULT_MAX_TOKENS, token_sequences
from specfamily.drafters.rest.drafter import default_datastore


def corpus_texts(dataset: str | None, data_files: str | None, field: str, split: str) -> Iterator[str]:
    """The texts to index: the zoo corpus's training split, or a ``datasets`` corpus's ``field``."""
    if dataset is None:
        for _, text in default_store.corpus_texts():  # the zoo corpus's train split, as the drafter's first use
            yield text
        return
    import datasets

    rows = datasets.load_dataset(dataset, data_files=data_files, split=split)
    for row in rows:
        yield row[field]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2", help="whose tokenizer (and default location)")
    parser.add_argument("--out", default=None, help="the datastore folder (default: where the drafter looks)")
    parser.add_argument("--dataset", default=None, help="a datasets corpus (default: the zoo corpus's train split)")
    parser.add_argument("--data-files", default=None)
    parser.add_argument("--field", default="text")
    parser.add_argument("--split", default="train")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    args = parser.parse_args(argv)
    target = load_target(args.target)
    out = Path(args.out) if args.out else default_datastore(target)
    source = args.dataset or default_store.SOURCE
    texts = corpus_texts(args.dataset, args.data_files, args.field, args.split)
    folder = build_datastore(token_sequences(texts, target.tokenizer, args.max_tokens), out, target.vocab_size,
                             source=f"{source}; {args.max_tokens} tokens at most")
    print(f"datastore -> {folder}")
    return folder


if __name__ == "__main__":
    main()
