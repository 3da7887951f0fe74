"""Batched draft forwards against drafting slot by slot: the proposal's CPU time per pass, same batch, same drafts.

For each drafter and batch size B, the first B Spec-Bench first turns (chat template, last ``--max-prompt-tokens``)
are decoded greedily through ``sf.generate_batch`` with a constant draft length (the drafter's default gamma, so both
arms draft the same lengths), in two arms interleaved ``--repeats`` times in one process:

- ``batched``: the family's own ``propose_batch`` (one draft forward per draft step for the whole batch);
- ``per-slot``: ``BaseDrafter.propose_batch``, each slot's own ``propose`` in turn (what every family but Medusa did
  before, self_spec through a batch-1 view of its slot whose appends copy the slot's entries).

It prints, per arm, the CPU time spent proposing per target pass and the whole run's tokens/s (median over repeats),
their ratios, and whether both arms gave the same tokens (they must: same drafts, same verifier).

    python benchmarks/batch_draft.py --threads 1 --batch-sizes 2,4,8 --drafters small_model,eagle,eagle3,self_spec
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core.drafter import BaseDrafter


def run_arm(target, name: str, prompts, args, clock, batched: bool) -> tuple[float, float, int, list]:
    """(propose seconds per pass, tokens/s, passes, tokens) of one batched run."""
    drafter = sf.create_drafter(name, target)
    drafter = sf.create_drafter(name, target, gamma=drafter.default_gamma)  # constant: the default gamma
    cls = type(drafter)
    own = cls.propose_batch
    spent = [0.0, 0]

    def timed(self, drafters, ctxs, gammas):
        start = clock()
        drafts = (own if batched else BaseDrafter.propose_batch)(self, drafters, ctxs, gammas)
        spent[0] += clock() - start
        spent[1] += 1
        return drafts

    cls.propose_batch = timed
    try:
        start = clock()
        results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens)
        seconds = clock() - start
    finally:
        cls.propose_batch = own
    tokens = sum(len(r.tokens) for r in results)
    return spent[0] / max(spent[1], 1), tokens / seconds, spent[1], [r.tokens for r in results]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch-sizes", default="2,4,8")
    parser.add_argument("--drafters", default="small_model,eagle,eagle3,self_spec")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    clock = make_clock(args.clock)
    target = sf.load_target(args.target)
    prompts, _ = spec_bench_prompts(3, target.tokenizer)
    prompts = [p[-args.max_prompt_tokens :] for p in prompts]
    print("| drafter | B | propose ms/pass, batched | per-slot | ratio | tok/s batched | per-slot | ratio | same |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.drafters.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            chosen = prompts[:batch]
            run_arm(target, name, chosen, args, clock, True)  # warm-up
            arms: dict[bool, list] = {True: [], False: []}
            for _ in range(args.repeats):
                for batched in (False, True):
                    arms[batched].append(run_arm(target, name, chosen, args, clock, batched))
            fast, slow = ([statistics.median(r[i] for r in arms[b]) for i in (0, 1)] for b in (True, False))
            same = all(r[3] == arms[True][0][3] for r in arms[True] + arms[False])
            print(f"| {name} | {batch} | {fast[0] * 1e3:.1f} | {slow[0] * 1e3:.1f} | {slow[0] / fast[0]:.2f}x | "
                  f"{fast[1]:.1f} | {slow[1]:.1f} | {fast[1] / slow[1]:.2f}x | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
