"""A plain, a chain and a tree pass split into their host steps, at a few cache lengths (issue 32, session 20).

Each step is timed by wrapping the function that does it on this target (the wrappers add ~1 us a step): the draft's
checks and the mask (``Target.forward`` before the model call), the lean forward's preparation (embedding, rope,
attention plan), the layer loop (C++ with ``native_layers``: products, attention, rope, cache writes), the final
norm, the LM head (a product), the lean forward's own Python (what is left of the model call), verification
(greedy, host), and the commit (a crop for the chain, a rewrite for the tree). Arms ``plain`` / ``chain`` / ``tree``
as ``benchmarks/pass_goals.py`` feeds them (root + ``--nodes`` tokens; the chain keeps half, the tree its second
branch), interleaved and rotated, medians over ``--repeats`` passes, this process's CPU time (one thread). Without
the C++ loop (a ``--matmul`` other than stream) "layers" reads 0 and the Python layer loop counts in "lean rest".

    python benchmarks/pass_host.py --threads 1 --lengths 300,700 --repeats 40
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch
from common import set_threads
from pass_cost import Shapes

from specfamily.core.acceptance import verify_draft
from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft, SamplingConfig

KINDS = ("plain", "chain", "tree")
STEPS = ("draft+mask", "prepare", "layers", "norm", "head", "lean rest", "verify", "commit")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="300,700", help="cache lengths, comma-separated")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=40)
    return parser.parse_args(argv)


class Steps:
    """Seconds per step of the current pass, from wrappers around the target's and its lean forward's functions."""

    def __init__(self, target: Target) -> None:
        self.now: dict[str, float] = defaultdict(float)
        lean = target.lean
        self._wrap(target, "_model_call", "model")
        self._wrap(lean, "_prepare", "prepare")
        self._wrap(lean, "native", "layers")
        self._wrap(lean, "_norm_fn", "norm")
        self._wrap(lean, "_linear", "head")

    def _wrap(self, owner, name: str, step: str) -> None:
        inner = getattr(owner, name)
        if inner is None:  # no C++ layer loop (another matmul kind): the Python loop counts as the lean's own
            return

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.now[step] += time.process_time() - start

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        now, self.now = self.now, defaultdict(float)
        return now


def one_pass(target: Target, steps: Steps, root: torch.Tensor, draft: Draft, path: list[int]) -> dict[str, float]:
    """Seconds of each step of one pass (then rolled back)."""
    length, clock = target.cached_length, time.process_time
    steps.take()
    start = clock()
    out = target.forward(root, draft)
    forwarded = clock()
    verify_draft(draft, out.logits, SamplingConfig(temperature=0.0), torch.Generator().manual_seed(0))
    verified = clock()
    target.commit(path)
    done = clock()
    target.rollback(length)
    inner = steps.take()
    parts = {step: inner[step] for step in ("prepare", "layers", "norm", "head")}
    parts["lean rest"] = inner["model"] - sum(parts.values())
    parts["draft+mask"] = forwarded - start - inner["model"]
    parts["verify"], parts["commit"] = verified - forwarded, done - verified
    return parts


@torch.inference_mode()
def measure(target: Target, steps: Steps, length: int, shapes: Shapes, repeats: int) -> dict[str, dict[str, float]]:
    """kind -> step -> median ms over ``repeats`` passes at a cache of ``length`` random tokens."""
    ids = torch.randint(0, min(target.vocab_size, 30000), (length + shapes.nodes + 1,),
                        generator=torch.Generator().manual_seed(length))
    target.reset()
    target.forward(ids[:length])
    target.commit([])
    ahead = ids[length + 1 :]
    tree = ahead.clone()
    tree[0] = (tree[0] + 1) % target.vocab_size
    arms = {"plain": (Draft.empty(), []), "chain": (Draft.chain(ahead), shapes.chain_path),
            "tree": (Draft(tree, torch.tensor(shapes.tree_parents)), shapes.tree_path)}
    times: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in KINDS}
    for round_ in range(repeats + 2):
        order = KINDS[round_ % 3 :] + KINDS[: round_ % 3]
        for kind in order:
            parts = one_pass(target, steps, ids[length : length + 1], *arms[kind])
            if round_ >= 2:
                for step, seconds in parts.items():
                    times[kind][step].append(seconds * 1e3)
    return {kind: {step: statistics.median(v) for step, v in by.items()} for kind, by in times.items()}


def arms_table(title: str, first: str, names: Sequence[str], value: Callable[[str, str], float]) -> str:
    """Markdown under ``title``: a row per name, a column per arm (KINDS), then each drafted arm minus plain."""
    rows = [title, f"| {first} | {' | '.join(KINDS)} | chain - plain | tree - plain |", "| --- |" + " ---: |" * 5]
    for name in names:
        values = [value(kind, name) for kind in KINDS]
        rows.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in values)
                    + f" | {values[1] - values[0]:+.3f} | {values[2] - values[0]:+.3f} |")
    return "\n".join(rows)


def table(length: int, medians: dict[str, dict[str, float]]) -> str:
    return arms_table(f"cache {length}: ms per pass (median)", "step", (*STEPS, "total"),
                      lambda k, step: sum(medians[k].values()) if step == "total" else medians[k][step])


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)
    target = load_target(args.model, matmul=args.matmul)
    steps, shapes = Steps(target), Shapes(args.nodes)
    result = {}
    for length in (int(v) for v in args.lengths.split(",")):
        result[length] = measure(target, steps, length, shapes, args.repeats)
        out(table(length, result[length]))
    return result


if __name__ == "__main__":
    main()
