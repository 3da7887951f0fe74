"""Plain batched decoding against transformers' padded batched ``generate``, per matmul kind, in one run.

For each batch size B (``--batches``) the first B Spec-Bench first turns (chat template, last ``--max-prompt-tokens``
tokens) are decoded greedily, ``--max-new-tokens`` each:

- ``hf``: transformers' ``generate`` on the left-padded batch (the model's own forward, F.linear);
- ``plain/<kind>``: ``sf.generate_batch(target, None, prompts)`` with the target's lean forward multiplying by
  ``<kind>`` (``--kinds``: exact = F.linear, bit-identical to transformers; stream = the packed C++ kernel; ...);
- at B=1 also ``generate/<kind>``: ``sf.generate`` itself (``generate_batch`` of one prompt must cost what it costs);
- ``<drafter>/<kind>`` for each of ``--drafters``: a fresh drafter at its defaults through ``generate_batch``
  (its creation not timed).

Arms interleaved within each round (the order rotating), ``--rounds`` rounds, CPU time of this process (one thread:
immune to other processes on the cores). Printed: each arm's median tokens/s, its ratio to ``hf`` per round (median,
min, max: the spread says how noisy the machine was) and how many requests' tokens differ from ``hf``'s.

    python benchmarks/batch_plain.py --threads 1 --batches 1,8 --kinds exact,stream --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from batch_sweep import hf_batch
from common import quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf


def timed(run) -> tuple[float, list[list[int]]]:
    """(CPU seconds of ``run()``, its tokens)."""
    start = time.process_time()
    tokens = run()
    return time.process_time() - start, tokens


def arms(model, tokenizer, kinds: list[str], batch: int, prompts: list[list[int]], n: int,
         drafters: tuple[str, ...] = ()) -> dict:
    """name -> a callable that decodes ``prompts`` and returns (CPU seconds, each request's new tokens)."""
    eos = sf.load_target(model, tokenizer=tokenizer).eos_token_ids
    found = {"hf": lambda: timed(lambda: hf_batch(model, prompts, n, eos))}
    for kind in kinds:
        target = sf.load_target(model, tokenizer=tokenizer, matmul=kind)
        found[f"plain/{kind}"] = lambda t=target: timed(lambda: [r.tokens for r in sf.generate_batch(
            t, None, prompts, n, trace=False)])
        if batch == 1:
            found[f"generate/{kind}"] = lambda t=target: timed(lambda: [sf.generate(t, None, p, n, trace=False).tokens
                                                                        for p in prompts])
        for name in drafters:
            found[f"{name}/{kind}"] = lambda t=target, name=name: drafted(t, name, prompts, n)
    return found


def drafted(target, name: str, prompts: list[list[int]], n: int) -> tuple[float, list[list[int]]]:
    """A fresh drafter at its defaults (made before the clock starts: nothing learnt in an earlier round), through
    ``generate_batch``."""
    drafter = sf.create_drafter(name, target)
    return timed(lambda: [r.tokens for r in sf.generate_batch(target, drafter, prompts, n, trace=False)])


def measure(found: dict, rounds: int) -> dict[str, list[tuple[float, list[list[int]]]]]:
    """Each arm's (CPU seconds, tokens) per round, the arms' order rotating round by round (after one warm-up)."""
    names = list(found)
    for name in names:
        found[name]()
    times: dict[str, list] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(found[name]())
    return times


def report(batch: int, times: dict) -> list[str]:
    hf_seconds = [s for s, _ in times["hf"]]
    reference = times["hf"][0][1]
    lines = [f"B={batch}: | arm | tok/s (median) | ratio to hf per round: median [min, max] | requests differing "
             "from hf |"]
    for name, rounds in times.items():
        tokens = sum(map(len, rounds[0][1]))
        tps = tokens / statistics.median(s for s, _ in rounds)
        ratios = [h / s for h, (s, _) in zip(hf_seconds, rounds, strict=True)]
        differ = sum(a != b for a, b in zip(rounds[0][1], reference, strict=True))
        lines.append(f"| {name} | {tps:.1f} | {statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"
                     f" | {differ} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--kinds", default="exact,stream")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--drafters", default="", help="comma-separated drafters at their defaults (default: none)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    base = sf.load_target(args.target)
    prompts, _ = spec_bench_prompts(3, base.tokenizer)
    prompts = [p[-args.max_prompt_tokens :] for p in prompts]
    for batch in (int(b) for b in args.batches.split(",")):
        drafters = tuple(args.drafters.split(",")) if args.drafters else ()
        found = arms(base.model, base.tokenizer, args.kinds.split(","), batch, prompts[:batch], args.max_new_tokens,
                     drafters)
        print("\n".join(report(batch, measure(found, args.rounds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
