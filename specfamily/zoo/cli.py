"""``specfamily-zoo``: prepare the corpus, train the zoo's models, build prompt sets."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import torch

from specfamily.zoo.train import TrainConfig


def _add_train_args(parser: argparse.ArgumentParser) -> None:
    for f in fields(TrainConfig):
        kind = type(f.default) if f.default is not f.default_factory else str
        if f.name in ("kind", "workdir", "out"):
            parser.add_argument(f"--{f.name}", required=True)
        else:
            flag = f"--{f.name.replace('_', '-')}"
            if kind is bool:
                parser.add_argument(flag, dest=f.name, action="store_true")
            else:
                parser.add_argument(flag, dest=f.name, type=kind, default=f.default)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="specfamily-zoo")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="corpus -> tokenizer and token arrays")
    prep.add_argument("--workdir", required=True)
    prep.add_argument("--root", default=None, help="a folder of text files instead of the stdlib")
    prep.add_argument("--suffix", default=".py")
    prep.add_argument("--vocab-size", type=int, default=4096)
    _add_train_args(sub.add_parser("train", help="train (or distil) one model"))
    prompts = sub.add_parser("prompts", help="build the held-out prompt sets")
    prompts.add_argument("--workdir", required=True)
    prompts.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.command == "prepare":
        from specfamily.zoo.prepare import prepare

        meta = prepare(Path(args.workdir), Path(args.root) if args.root else None, args.suffix, args.vocab_size)
        print(f"train tokens {meta['train_tokens']}, held-out tokens {meta['heldout_tokens']}, sha256 {meta['sha256']}")
    elif args.command == "train":
        from specfamily.zoo.train import train

        values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
        state = train(TrainConfig(**values))
        print(f"done: step {state.step}, tokens {state.tokens_seen}, held-out loss {state.heldout_loss:.4f}")
    else:
        from specfamily.zoo.prompts import build_prompt_sets

        manifest = build_prompt_sets(Path(args.workdir), Path(args.out))
        print(", ".join(f"{name}: {count} prompts" for name, count in manifest["counts"].items()) + f" in {args.out}")


if __name__ == "__main__":
    main()
