"""Where a batched run's CPU time goes, per method: target forwards, proposals, planning, verification, commit.

For ``--batch`` B and a queue of ``--requests-per-slot`` R times B Spec-Bench first turns (chat template, last
``--max-prompt-tokens``), greedy, plain batched decoding and each drafter at its defaults run through
``sf.generate_batch`` (max_batch B), interleaved, ``--rounds`` rounds; each run prints its CPU seconds (one thread:
``time.process_time``), tokens/s, slot-passes (the requests' target passes summed), tokens per slot-pass (tau) and the
seconds spent in each part, measured by wrapping the loop's calls; the last round also the first request's
``policy_note`` (what the length policy planned).

    python benchmarks/batch_parts.py --threads 1 --batch 4 --requests-per-slot 2 --drafters prompt_lookup,suffix
"""

from __future__ import annotations

import argparse
import sys
import time

from common import quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core import batch_loop

PARTS = ((batch_loop.BatchTarget, "forward", "forward"), (batch_loop._Batch, "_propose", "propose"),
         (batch_loop._Batch, "_planned", "plan after proposing"), (batch_loop._Batch, "_load_gammas", "plan"),
         (batch_loop._Batch, "_commit", "commit"), (batch_loop, "_verified", "verify"))


def wrap(spent: dict[str, float]) -> None:
    """Time every part into ``spent`` (CPU seconds), for the rest of the process."""
    for owner, name, part in PARTS:
        setattr(owner, name, _timed(getattr(owner, name), part, spent))


def _timed(own, part: str, spent: dict[str, float]):
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return own(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0.0) + time.process_time() - start
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--drafters", default="prompt_lookup,suffix")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, _ = spec_bench_prompts(3, target.tokenizer)
    prompts = [p[-args.max_prompt_tokens:] for p in prompts][: args.batch * args.requests_per_slot]
    spent: dict[str, float] = {}
    wrap(spent)
    for round_ in range(args.rounds):
        for name in ["plain", *args.drafters.split(",")]:
            spent.clear()
            drafter = None if name == "plain" else sf.create_drafter(name, target)  # loading is not timed
            start = time.process_time()
            results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens, max_batch=args.batch)
            seconds = time.process_time() - start
            tokens = sum(len(r.tokens) for r in results)
            passes = sum(r.metrics.target_passes for r in results)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in spent.items())
            print(f"round {round_ + 1} {name}: {seconds:.2f} s, {tokens / seconds:.1f} tok/s, slot-passes {passes}, "
                  f"tau {tokens / passes:.2f}; {parts}", flush=True)
            if round_ == args.rounds - 1 and drafter is not None:
                print(f"    {results[0].metrics.policy_note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
