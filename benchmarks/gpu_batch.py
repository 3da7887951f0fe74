"""Batched decoding on a GPU with random weights: the method's own picture there, and plain batched decoding against
transformers' padded batch (issue 33 on the machine its goals were written for).

On this project's 2-core CPU a pass feeding 5 tokens a request costs 2.2x a 1-token pass at 4 requests, and even a
drafter fed only the tokens the target accepts gains nothing from 4 requests on (docs/batching-log.md, session 39). A
GPU reads the weights once for every row of a pass, so the picture should differ. The weights of a real checkpoint
cannot reach a lent GPU (benchmarks/gpu_shapes.py says why) and timing does not depend on their values, so this builds a
target's architecture with random weights on the device (``gpu_shapes.random_model``) and measures, per shape:

- the method's picture: t(B, 5) / t(B, 1), one batched pass feeding a root and a 4-token chain per request against
  one feeding the root alone, over B caches holding a ``--context``-token prompt (``batch_sweep.pass_seconds``), for
  every B of ``--batches``;
- plain batched decoding (``sf.generate_batch`` with no drafter) against transformers' ``generate()`` on the same
  left-padded batch, at every B of ``--peer-batches``: tokens/s, and how many requests' texts are identical;
- prompt lookup at its defaults against plain batched decoding at the same B (informational: a random model's greedy
  text falls into loops that prompt lookup copies, so its acceptance says nothing about real text; what it shows is
  whether the cost-aware plan drafts where rows are cheap, and every request's text must equal plain decoding's).

    python benchmarks/gpu_batch.py --out batch.json                                   # on the GPU machine
    python benchmarks/gpu_batch.py --device cpu --batches 1,2 --peer-batches 2 --tokens 4 --context 16   # a dry run
"""

from __future__ import annotations

import argparse

import torch
from batch_sweep import hf_batch, pass_seconds
from gpu_shapes import SHAPES, built, emit, save, timed

import specfamily as sf


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def picture(target, prompt: list[int], batches: list[int], repeats: int, clock) -> dict:
    """B -> t(B, 1) ms, t(B, 5) ms and their ratio."""
    rows = {}
    for batch in batches:
        one, five = pass_seconds(target, prompt, batch, repeats, clock)
        rows[batch] = {"t1_ms": round(1000 * one, 3), "t5_ms": round(1000 * five, 3), "ratio": round(five / one, 3)}
    return rows


def peer(target, model, prompts: list[list[int]], tokens: int, clock) -> dict:
    """Plain batched decoding, transformers' padded batch and prompt lookup on ``prompts`` (all at once), after one
    untimed call of each: tokens/s, and identical texts."""
    eos = tuple(target.eos_token_ids)
    arms = {
        "ours": lambda: [r.tokens for r in sf.generate_batch(target, None, prompts, tokens)],
        "transformers": lambda: hf_batch(model, prompts, tokens, eos),
        "prompt_lookup": lambda: [r.tokens for r in sf.generate_batch(
            target, sf.create_drafter("prompt_lookup", target), prompts, tokens)],
    }
    for fn in arms.values():
        fn()
    seconds, texts = {}, {}
    for name, fn in arms.items():
        seconds[name], texts[name] = timed(fn, clock)
    total = {name: sum(map(len, rows)) for name, rows in texts.items()}
    same = {name: sum(a == b for a, b in zip(rows, texts["ours"], strict=True)) for name, rows in texts.items()}
    if same["prompt_lookup"] != len(prompts):
        raise RuntimeError("prompt lookup's batched text differs from plain batched decoding's")
    return {"tokens_per_s": {name: round(total[name] / seconds[name], 1) for name in arms},
            "ours_over_transformers": round(seconds["transformers"] / seconds["ours"], 3),
            "prompt_lookup_over_ours": round(seconds["ours"] / seconds["prompt_lookup"], 3),
            "transformers_identical": f"{same['transformers']}/{len(prompts)}"}


def measure(shape: str, args) -> dict:
    device = torch.device(args.device)
    model, target, seconds, clock, gen, context = built(shape, args.dtype, args)
    vocab = model.config.vocab_size
    record = {"shape": shape, "dtype": args.dtype, "device": str(device), "build_seconds": round(seconds, 2),
              "lean_forward": target.lean is not None, "context": args.context,
              "picture": picture(target, context, args.batches, args.repeats, clock), "peer": {}}
    for batch in args.peer_batches:
        prompts = [torch.randint(0, vocab, (args.prompt_tokens,), generator=gen).tolist() for _ in range(batch)]
        record["peer"][batch] = peer(target, model, prompts, args.tokens, clock)
    if device.type == "cuda":
        record["max_allocated_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="smollm2", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batches", type=sizes, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--peer-batches", type=sizes, default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--spread", type=float, default=4.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    save([emit(measure(shape, args)) for shape in args.shapes.split(",")], args.out)


if __name__ == "__main__":
    main()
