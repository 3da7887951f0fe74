"""What a drafter costs on the batched passes it does not draft: plain batched decoding against the same run with the
drafter attached but never drafting, against the drafter's passes whose plan drafts nothing, and its defaults; each
arm's time split into the target forwards, the drafter's own calls and the loop's host work beside them.

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

Per arm the median over the rounds (``--clock``: CPU time of the process on one thread) of its seconds and of its
parts: ``forward`` (inside the target's ``BatchTarget.forward``: its passes; a draft model's own batched passes are
the proposal's), ``propose`` (the drafters' batched proposals, catch-up included), ``observe`` (every slot's
``observe``), ``admit`` (admissions: slot copies, ``begin``), ``plan`` (the draft lengths: ``_load_gammas`` and
``_plan_drafts``) and ``rest`` (verification, commit, the loop); the counts: target passes, passes that fed a draft,
probes (plans whose kind was ``probe``), fed rows over all passes; and the arm's seconds over plain's, per round
(interleaved, so paired): the median and a 95% t interval of the mean of the per-round ratios. Every arm's tokens are
compared with plain decoding's, request by request.

    cd benchmarks && python batch_idle.py --threads 1 --batch-sizes 4,8 --repeats 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from common import make_clock, paired_interval, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.batch_lengths import LengthPolicy
from specfamily.core.batch_target import BatchTarget

ARMS = ("plain", "never", "nodraft", "default")
PARTS = ("forward", "propose", "observe", "admit", "plan")


@contextmanager
def patched(obj, name: str, value):
    own, held = getattr(obj, name), name in vars(obj)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if held:
            setattr(obj, name, own)
        else:  # an inherited method: uncovered again
            delattr(obj, name)


@dataclass
class Run:
    seconds: float
    parts: dict[str, float]
    counts: dict[str, int]
    tokens: list

    @property
    def rest(self) -> float:
        return self.seconds - sum(self.parts.values())


@dataclass
class _Spent:
    clock: object
    target: object
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("passes", "drafted", "probes", "rows"), 0))
    kind: str = ""

    def timed(self, own, part: str):
        def call(*a, **k):
            start = self.clock()
            try:
                return own(*a, **k)
            finally:
                self.parts[part] += self.clock() - start

        return call

    def forward(self, own):
        def call(batch, lo, feeds, *a, **k):
            if batch.target is not self.target:  # a draft model's batched pass: the proposal's
                return own(batch, lo, feeds, *a, **k)
            start = self.clock()
            try:
                return own(batch, lo, feeds, *a, **k)
            finally:
                self.parts["forward"] += self.clock() - start
                self.counts["passes"] += 1
                self.counts["drafted"] += any(len(f.draft) for f in feeds)
                self.counts["rows"] += batch.rows

        return call

    def decide(self, own):
        def call(*a, **k):
            out = own(*a, **k)
            self.kind = out[2]
            return out

        return call

    def plan(self, own):
        def call(*a, **k):  # LengthPolicy._plan(self, batch, prospects, proposed, together, decided=None)
            decided = a[5] if len(a) > 5 else k.get("decided")
            out = own(*a, **k)  # decides (``decide`` keeps the kind) unless ``decided`` was made before
            self.counts["probes"] += (self.kind if decided is None else decided[2]) == "probe"
            self.kind = ""
            return out

        return call


def run(target, name: str | None, arm: str, prompts, batch: int, args, clock) -> Run:
    """One batched run of ``arm``: its seconds, its parts' seconds, its counts, its tokens."""
    drafter = None if name is None else sf.create_drafter(name, target)  # loading is not timed
    spent = _Spent(clock, target)
    with ExitStack() as stack:
        stack.enter_context(patched(BatchTarget, "forward", spent.forward(BatchTarget.forward)))
        stack.enter_context(patched(batch_loop, "propose_batch", spent.timed(batch_loop.propose_batch, "propose")))
        stack.enter_context(patched(batch_loop._Batch, "_admit", spent.timed(batch_loop._Batch._admit, "admit")))
        for method in ("_load_gammas", "_plan_drafts"):
            stack.enter_context(
                patched(batch_loop._Batch, method, spent.timed(getattr(batch_loop._Batch, method), "plan"))
            )
        stack.enter_context(patched(LengthPolicy, "_decide", spent.decide(LengthPolicy._decide)))
        stack.enter_context(patched(LengthPolicy, "_plan", spent.plan(LengthPolicy._plan)))
        if drafter is not None:
            kind = type(drafter)
            stack.enter_context(patched(kind, "observe", spent.timed(kind.observe, "observe")))
        if arm == "never":
            stack.enter_context(patched(LengthPolicy, "may_draft", lambda self, batch: False))
        if arm == "nodraft":
            stack.enter_context(
                patched(
                    LengthPolicy,
                    "lengths",
                    lambda self, prospects, *a, **k: [0] * len(prospects),
                )
            )
        start = clock()
        results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens, max_batch=batch)
        seconds = clock() - start
    return Run(seconds, spent.parts, spent.counts, [r.tokens for r in results])


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
    prompts = [p[-args.max_prompt_tokens :] for p in prompts]
    arms = args.arms.split(",")
    print(
        f"{args.max_new_tokens} new tokens, {args.requests_per_slot} requests a slot, {args.clock} clock, "
        f"{args.threads} thread(s), matmul {args.matmul}, median of {args.repeats} interleaved rounds; seconds"
    )
    print(
        "| B | drafter | arm | seconds | " + " | ".join(PARTS) + " | rest | passes | drafted | probes | rows | "
        "over plain (95% CI) | same |"
    )
    print("| ---: | --- | --- | " + "---: | " * (len(PARTS) + 7) + "--- |")
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        chosen = prompts[: batch * args.requests_per_slot]
        for name in args.drafters.split(","):
            for arm in arms:  # warm-up: kernels, calibration, the cost table kept on the target
                run(target, None if arm == "plain" else name, arm, chosen, batch, args, clock)
            rounds: dict[str, list[Run]] = {arm: [] for arm in arms}
            for i in range(args.repeats):
                for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:  # each round starts one arm later
                    rounds[arm].append(run(target, None if arm == "plain" else name, arm, chosen, batch, args, clock))
            _report(batch, name, rounds)
    return 0


def _report(batch: int, name: str, rounds: dict[str, list[Run]]) -> None:
    plain = rounds.get("plain")
    tokens = plain[0].tokens if plain else None
    for arm, runs in rounds.items():
        seconds = statistics.median(r.seconds for r in runs)
        parts = [statistics.median(r.parts[p] for r in runs) for p in PARTS]
        rest = statistics.median(r.rest for r in runs)
        counts = [statistics.median(r.counts[c] for r in runs) for c in ("passes", "drafted", "probes", "rows")]
        same = tokens is None or all(r.tokens == tokens for r in runs)
        over = ""
        if plain:
            ratios = [r.seconds / p.seconds for r, p in zip(runs, plain, strict=True)]
            lo, hi = paired_interval(ratios) or (math.nan, math.nan)
            over = f"{statistics.median(ratios):.3f} ({lo:.3f}-{hi:.3f})"
        print(
            f"| {batch} | {name} | {arm} | {seconds:.3f} | "
            + " | ".join(f"{p:.3f}" for p in parts)
            + f" | {rest:.3f} | "
            + " | ".join(f"{c:.0f}" for c in counts)
            + f" | {over} | {same} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
