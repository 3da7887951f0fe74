"""What a drafter costs on the batched passes it does not draft: plain batched decoding against the same run with the
drafter attached but never drafting, against the drafter's passes whose plan drafts nothing, and its defaults; each
arm's time split into the target forwards and the host work beside them.

For each batch size B and drafter, a queue of ``--requests-per-slot`` R times B Spec-Bench first turns (chat template,
last ``--max-prompt-tokens``) is decoded greedily through ``sf.generate_batch(max_batch=B)`` in four arms, interleaved
``--repeats`` times in one process after a warm-up round:

- ``plain``: no drafter;
- ``never``: the drafter attached, the batch's length policy never letting a pass draft (``LengthPolicy.may_draft``
  patched to False): no proposal, no plan; what is left over plain is the pure overhead of having the drafter
  (admission, features, ``observe``, policy updates);
- ``nodraft``: every plan forced to draft nothing (``LengthPolicy.lengths`` patched to 0s): the loop proposes and plans
  as at its defaults (lookahead proposals included) and feeds no draft: what a pass whose plan drafts nothing costs;
- ``default``: the drafter at its defaults (draft length by load).

Per arm the median over the rounds of its seconds (``--clock``: CPU time of the process on one thread), the seconds
inside ``BatchTarget.forward`` (the target's passes), the rest (host work: proposals, planning, verification,
commit, observe), the batched passes and the host milliseconds per pass; each arm's time over plain's. Every arm's
tokens are compared with plain decoding's, request by request.

    cd benchmarks && python batch_idle.py --threads 1 --batch-sizes 4,8 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core.batch_lengths import LengthPolicy
from specfamily.core.batch_target import BatchTarget

ARMS = ("plain", "never", "nodraft", "default")


@contextmanager
def patched(obj, name: str, value):
    own = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, own)


@dataclass
class Run:
    seconds: float
    forward: float
    passes: int
    tokens: list


def run(target, name: str | None, arm: str, prompts, batch: int, args, clock) -> Run:
    """One batched run of ``arm``: its seconds, the seconds in the target's forwards, its passes, its tokens."""
    drafter = None if name is None else sf.create_drafter(name, target)  # loading is not timed
    spent = {"forward": 0.0, "passes": 0}
    own = BatchTarget.forward

    def forward(self, *a, **k):
        start = clock()
        try:
            return own(self, *a, **k)
        finally:
            spent["forward"] += clock() - start
            spent["passes"] += 1

    with ExitStack() as stack:
        stack.enter_context(patched(BatchTarget, "forward", forward))
        if arm == "never":
            stack.enter_context(patched(LengthPolicy, "may_draft", lambda self, batch: False))
        if arm == "nodraft":
            stack.enter_context(patched(LengthPolicy, "lengths", lambda self, prospects, proposed=False,
                                        together=False, contexts=None: [0] * len(prospects)))
        start = clock()
        results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens, max_batch=batch)
        seconds = clock() - start
    return Run(seconds, spent["forward"], spent["passes"], [r.tokens for r in results])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch-sizes", default="4,8")
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--drafters", default="prompt_lookup,suffix,eagle,medusa,small_model")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    clock = make_clock(args.clock)
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, _ = spec_bench_prompts(3, target.tokenizer)
    prompts = [p[-args.max_prompt_tokens:] for p in prompts]
    arms = args.arms.split(",")
    print(f"{args.max_new_tokens} new tokens, {args.requests_per_slot} requests a slot, {args.clock} clock, "
          f"{args.threads} thread(s), matmul {args.matmul}, median of {args.repeats} interleaved rounds")
    print("| B | drafter | arm | seconds | forward s | host s | passes | host ms/pass | over plain | same |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        chosen = prompts[: batch * args.requests_per_slot]
        for name in args.drafters.split(","):
            for arm in arms:  # warm-up: kernels, calibration, the cost table kept on the target
                run(target, None if arm == "plain" else name, arm, chosen, batch, args, clock)
            rounds: dict[str, list[Run]] = {arm: [] for arm in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    rounds[arm].append(run(target, None if arm == "plain" else name, arm, chosen, batch, args, clock))
            _report(batch, name, rounds)
    return 0


def _report(batch: int, name: str, rounds: dict[str, list[Run]]) -> None:
    plain = rounds.get("plain")
    base = statistics.median(r.seconds for r in plain) if plain else None
    tokens = plain[0].tokens if plain else None
    for arm, runs in rounds.items():
        seconds = statistics.median(r.seconds for r in runs)
        forward = statistics.median(r.forward for r in runs)
        host = statistics.median(r.seconds - r.forward for r in runs)
        passes = statistics.median(r.passes for r in runs)
        same = tokens is None or all(r.tokens == tokens for r in runs)
        over = f"{seconds / base:.3f}" if base else ""
        print(f"| {batch} | {name} | {arm} | {seconds:.3f} | {forward:.3f} | {host:.3f} | {passes:.0f} | "
              f"{1000 * host / passes:.2f} | {over} | {same} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
