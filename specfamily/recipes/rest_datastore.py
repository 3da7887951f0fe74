"""A REST datastore for a target: ``python -m specfamily.recipes.rest_datastore [--target zoo:smollm2] [--out DIR]``.

Text (never an evaluation prompt set), one of:
- default: the target's own default, where the rest drafter finds it (``<specfamily cache>/rest/...``): for
  ``zoo:smollm2`` the chat token file shipped with rest (its own answers to non-evaluation user turns), else the
  zoo corpus's training split;
- ``--code-corpus``: the zoo corpus's training split (the standard library's Python sources, :mod:`corpus`);
- ``--distill DIR``: a distillation folder's training split (``specfamily-zoo distill``: the target's greedy answers
  to Magpie and code user turns, turns overlapping Spec-Bench left out), each conversation whole;
- ``--dataset``: any ``datasets`` corpus (``--dataset json --data-files F.jsonl --field text``).
Text is tokenized with the target's tokenizer up to ``--max-tokens``; built once (atomically), reused.
``--save-tokens FILE`` also writes the token sequences (:mod:`~specfamily.drafters.rest.token_file`): how the shipped
file was made (``--distill work/smollm2-distill --save-tokens specfamily/drafters/rest/smollm2_chat.safetensors``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from specfamily.core.target import load_target
from specfamily.drafters.rest import default_store
from specfamily.drafters.rest.datastore import build_datastore
from specfamily.drafters.rest.default_store import DEFAULT_MAX_TOKENS, token_sequences
from specfamily.drafters.rest.drafter import build_default_datastore, corpus_datastore, default_datastore
from specfamily.drafters.rest.token_file import write_token_file


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


def distilled_sequences(folder: str | Path, max_tokens: int) -> Iterator[list[int]]:
    """Each training conversation of a distillation folder (chat prompt and answer, as the target saw them), until
    ``max_tokens`` are given; the held-out split is left out."""
    from specfamily.train.distilled import load_distilled

    train, _ = load_distilled(folder)
    given = 0
    for i in range(len(train)):
        tokens = train.conversation(i)[0][: max_tokens - given].tolist()
        given += len(tokens)
        yield tokens
        if given >= max_tokens:
            return


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:smollm2", help="whose tokenizer (and default location)")
    parser.add_argument("--out", default=None, help="the datastore folder (default: where the drafter looks)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--code-corpus", action="store_true", help="the zoo corpus's train split")
    source.add_argument("--distill", default=None, help="a distillation folder (its training conversations)")
    source.add_argument("--dataset", default=None, help="a datasets corpus")
    parser.add_argument("--data-files", default=None)
    parser.add_argument("--field", default="text")
    parser.add_argument("--split", default="train")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--save-tokens", default=None, help="also write the token sequences to this file")
    return parser


def main(argv: list[str] | None = None) -> Path | None:
    args = _parser().parse_args(argv)
    target = load_target(args.target)
    if not (args.code_corpus or args.distill or args.dataset):  # the drafter's own default
        if args.save_tokens:
            raise SystemExit("--save-tokens needs a source: --code-corpus, --distill or --dataset")
        out = Path(args.out) if args.out else default_datastore(target)
        folder = build_default_datastore(target, out)
        print(f"datastore -> {folder}")
        return folder
    if args.distill:
        sequences = list(distilled_sequences(args.distill, args.max_tokens))
        source = f"distillation {Path(args.distill).name} (training conversations)"
    else:
        texts = corpus_texts(args.dataset, args.data_files, args.field, args.split)
        sequences = list(token_sequences(texts, target.tokenizer, args.max_tokens))
        source = args.dataset or default_store.SOURCE
    source = f"{source}; {args.max_tokens} tokens at most"
    if args.save_tokens:
        print(f"tokens -> {write_token_file(sequences, args.save_tokens, source)}")
    out = Path(args.out) if args.out else corpus_datastore(target) if args.code_corpus else None
    if out is None:
        if not args.save_tokens:
            raise SystemExit("--distill and --dataset need --out DIR (or --save-tokens FILE)")
        return None
    folder = build_datastore(sequences, out, target.vocab_size, source=source)
    print(f"datastore -> {folder}")
    return folder


if __name__ == "__main__":
    main()
