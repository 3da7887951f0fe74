"""What a drafter costs on the batched passes it does not draft: plain batched decoding against the same run with the
drafter attached and every draft length the batch's length policy plans forced to 0, and the drafter at its defaults;
the idle arm's extra CPU time split by where it goes.

For each drafter, the first ``--batch`` Spec-Bench first turns (chat template, last ``--max-prompt-tokens``) are
decoded greedily through ``sf.generate_batch`` in three arms, interleaved ``--repeats`` times in one process:

- ``plain``: no drafter;
- ``idle``: the drafter attached, every steady pass planned at length 0 (``LengthPolicy.lengths`` patched to 0s): only
  the prefill passes may draft (each slot's own policy plans those, as in the default arm);
- ``default``: the drafter at its defaults (draft length by load).

Per arm the median CPU seconds (one thread: ``time.process_time``) and tokens/s; for the idle arm also the seconds
spent in the slots' ``observe``, ``propose_batch`` (prefill-pass drafts and catch-up), the slots' policy updates,
admission (slot copies, ``begin``, cost binding) and the features the target returns for the drafter, measured by
wrapping those calls. Every arm's tokens are compared with plain decoding's, request by request.

    python benchmarks/batch_idle.py --threads 1 --batch 8 --drafters prompt_lookup,suffix,eagle,medusa,small_model
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from contextlib import contextmanager

from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.batch_lengths import LengthPolicy

PARTS = ("observe", "propose", "policy", "admit")


@contextmanager
def patched(obj, name: str, wrapper):
    own = getattr(obj, name)
    setattr(obj, name, wrapper(own))
    try:
        yield
    finally:
        setattr(obj, name, own)


def timer(spent: dict, part: str, clock):
    def wrap(own):
        def timed(*args, **kwargs):
            start = clock()
            try:
                return own(*args, **kwargs)
            finally:
                spent[part] += clock() - start
        return timed
    return wrap


def _zeros(own):
    return lambda self, prospects, proposed=False, together=False: [0] * len(prospects)


def run(target, name: str | None, prompts, args, clock, idle: bool) -> tuple[float, list, dict]:
    """(CPU seconds, tokens per request, seconds per part) of one batched run."""
    drafter = None if name is None else sf.create_drafter(name, target)  # loading is not timed
    spent: dict[str, float] = defaultdict(float)
    with (patched(LengthPolicy, "lengths", _zeros if idle else (lambda own: own)),
          patched(batch_loop, "propose_batch", timer(spent, "propose", clock)),
          patched(batch_loop, "_report", timer(spent, "policy", clock)),
          patched(batch_loop._Batch, "_admit", timer(spent, "admit", clock))):
        cls = type(drafter) if drafter is not None else None
        with patched(cls, "observe", timer(spent, "observe", clock)) if cls is not None else _nothing():
            start = clock()
            results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens)
            seconds = clock() - start
    return seconds, [r.tokens for r in results], dict(spent)


@contextmanager
def _nothing():
    yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="exact")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--drafters", default="prompt_lookup,suffix,eagle,medusa,small_model")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    clock = make_clock(args.clock)
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, _ = spec_bench_prompts(3, target.tokenizer)
    prompts = [p[-args.max_prompt_tokens:] for p in prompts][: args.batch]
    run(target, None, prompts, args, clock, False)  # warm-up
    print(f"B={args.batch}, {args.max_new_tokens} new tokens, CPU seconds (median of {args.repeats}), matmul "
          f"{args.matmul}; idle-arm parts: seconds in " + ", ".join(PARTS))
    print("| drafter | plain s | idle s | idle/plain | default s | plain/default (speedup) | idle parts | same |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.drafters.split(","):
        run(target, name, prompts, args, clock, True)  # warm-up: calibration, kernels
        arms: dict[str, list] = defaultdict(list)
        for _ in range(args.repeats):
            arms["plain"].append(run(target, None, prompts, args, clock, False))
            arms["idle"].append(run(target, name, prompts, args, clock, True))
            arms["default"].append(run(target, name, prompts, args, clock, False))
        med = {arm: statistics.median(r[0] for r in rounds) for arm, rounds in arms.items()}
        plain_tokens = arms["plain"][0][1]
        same = all(r[1] == plain_tokens for rounds in arms.values() for r in rounds)
        parts = {p: statistics.median(r[2].get(p, 0.0) for r in arms["idle"]) for p in PARTS}
        shown = ", ".join(f"{p} {s:.2f}" for p, s in parts.items())
        print(f"| {name} | {med['plain']:.2f} | {med['idle']:.2f} | {med['idle'] / med['plain']:.2f}x | "
              f"{med['default']:.2f} | {med['plain'] / med['default']:.2f}x | {shown} | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
