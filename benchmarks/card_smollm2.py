"""ZOO.md's measurements of zoo:smollm2: held-out loss, the pass-cost curve and greedy samples.

- held-out loss: mean next-token negative log-likelihood (nats/token) over the zoo's held-out `complete`
  prompts (Python standard-library source the 12M code model never trained on; SmolLM2's own tokenizer);
- pass cost: t(n) of one target pass over n = 1 + g tokens after a context, through the very Target calls the
  decode loop makes (medians of interleaved repeats), and t(n) / t(1);
- samples: the greedy answers to a few of the zoo's `instruct` prompts (chat template).

    python benchmarks/card_smollm2.py --threads 2 --out docs/smollm2-card.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import common
import torch

SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@torch.inference_mode()
def heldout_loss(target, texts: list[str], max_tokens: int = 512) -> tuple[float, int]:
    """(mean nats per predicted token, tokens predicted) over ``texts``, each cut to its first ``max_tokens``."""
    total, count = 0.0, 0
    for text in texts:
        ids = target.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids[:, :max_tokens]
        if ids.shape[1] < 2:
            continue
        logits = target.model(ids).logits[0, :-1].double()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
        total, count = total + float(nll), count + ids.shape[1] - 1
    return total / count, count


def samples(target, prompts: list[str], max_new_tokens: int) -> list[dict]:
    import specfamily as sf
    from specfamily.io.chat import answer_text, chat_prompt_ids

    out = []
    for text in prompts:
        result = sf.generate(target, None, chat_prompt_ids(target.tokenizer, [text]), max_new_tokens)
        out.append({"prompt": text, "answer": answer_text(target.tokenizer, result.tokens)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=40, help="held-out `complete` prompts scored")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import specfamily as sf
    from specfamily.core.costs import measure_pass_seconds
    from specfamily.zoo.prompts import load_prompt_set

    common.set_threads(args.threads)
    common.quiet_transformers()
    started = time.perf_counter()
    target = sf.load_target("zoo:smollm2")
    complete = load_prompt_set("complete")
    step = max(1, len(complete) // args.texts)
    loss, tokens = heldout_loss(target, [complete[i]["prompt"] for i in range(0, len(complete), step)][: args.texts])
    instruct = load_prompt_set("instruct")["prompt"]
    context = target.tokenizer(instruct[0]).input_ids * 8
    seconds = measure_pass_seconds(target, context[:256], SIZES, args.repeats)
    card = {
        "heldout_nats_per_token": loss, "heldout_perplexity": math.exp(loss), "heldout_tokens": tokens,
        "t1_ms": 1000 * seconds[0], "pass_ms": {g + 1: 1000 * s for g, s in seconds.items()},
        "verify_cost": {g: s / seconds[0] for g, s in seconds.items()},
        "samples": samples(target, [instruct[i] for i in (1, 14, 28)], 96),
        "threads": args.threads, "environment": common.environment(args.threads, "wall"),
    }
    print(json.dumps(card, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(card, indent=1) + "\n")
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
