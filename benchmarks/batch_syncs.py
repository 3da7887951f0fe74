"""What an accelerator would wait for in a batched pass, per registered drafter: the host synchronisations of
``sf.generate_batch`` counted on a stand-in model (``specfamily.testing.syncs``: its weights "on an accelerator", the
whole loop followed by the counter, values computed on the CPU), per pass at two batch sizes, by the line that made
them. Waits a pass that grow with the batch size are waits a GPU pays once a request a pass.

Each drafter as the CUDA tests build it (``specfamily.recipes.every_drafter``: a constant draft length, random weights
where it needs trained ones), on a tiny random Llama, greedy. A drafter the counter cannot follow (a tensor made
outside its view) is listed with the error. No GPU needed; the same count under torch.cuda's own debug mode is
tests/gpu/test_cuda_syncs.py.

    python benchmarks/batch_syncs.py --batches 2,4 --requests 8 --new-tokens 16 [--drafters plain,eagle] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import specfamily as sf
from specfamily.core.batch_target import BatchTarget
from specfamily.core.target import load_target
from specfamily.recipes.every_drafter import every_drafter
from specfamily.testing import tiny_model
from specfamily.testing.greedy import greedy_prompts
from specfamily.testing.syncs import SyncCounter, stand_in_module

VOCAB = 256


@dataclass
class Count:
    """One drafter's run at one batch size: its waits, passes and request-passes, the waits by file:line (most
    first), or its error."""

    drafter: str
    batch: int
    waits: int = 0
    passes: int = 0
    request_passes: int = 0
    sites: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @property
    def per_pass(self) -> str:
        return "-" if self.error is not None else f"{self.waits / self.passes:.1f}"


def row(counts: list[Count]) -> str:
    """The table's row of one drafter: its waits a pass at each batch size, where the largest's come from."""
    last = counts[-1]
    where = (f"not counted: {last.error}" if last.error is not None else
             ", ".join(f"{site} {n}" for site, n in list(last.sites.items())[:4]))
    return f"| {last.drafter} | {' | '.join(c.per_pass for c in counts)} | {where} |"


def count(name: str, factory, prompts: list[list[int]], batch: int, new_tokens: int) -> Count:
    """``name``'s waits on a fresh stand-in model (the target's passes counted through ``BatchTarget.forward``; a
    drafter's own batched passes, small_model's, are not passes of the decoding)."""
    fed: list[int] = []
    forward, models = BatchTarget.forward, []

    def counted(self, lo, feeds, *rest):
        if self.target.model in models:
            fed.append(len(feeds))
        return forward(self, lo, feeds, *rest)

    BatchTarget.forward = counted
    try:
        with SyncCounter() as counter:
            model = stand_in_module(tiny_model("llama", VOCAB, seed=0, dtype=torch.float32, spread=1.0, hidden=64,
                                               layers=4))
            models.append(model)
            target = load_target(model)
            drafter = factory(target)
            start = len(counter.syncs)
            sf.generate_batch(target, drafter, prompts, new_tokens, max_batch=batch, trace=False)
    except Exception as error:  # noqa: BLE001 - reported in the table: the counter could not follow this drafter
        return Count(name, batch, error=f"{type(error).__name__}: {str(error).splitlines()[0][:100]}")
    finally:
        BatchTarget.forward = forward
    sites = Counter(_site(sync.where) for sync in counter.syncs[start:])
    return Count(name, batch, sum(sites.values()), len(fed), sum(fed), dict(sites.most_common()))


def _site(where: str) -> str:
    """``path/to/file.py:line`` as ``file.py:line``."""
    path, line = where.rsplit(":", 1)
    return f"{Path(path).name}:{line}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="2,4", help="comma-separated max_batch values")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--drafters", default=None, help="comma-separated (default: every registered drafter)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    prompts = [p.tolist() for p in greedy_prompts(VOCAB, args.requests)]
    table = every_drafter(prompts)
    names = args.drafters.split(",") if args.drafters else list(table)
    unknown = [name for name in names if name not in table]
    if unknown:
        parser.error(f"unknown drafters {unknown}; known: {sorted(table)}")
    batches = [int(b) for b in args.batches.split(",")]
    counts = {name: [count(name, table[name], prompts, b, args.new_tokens) for b in batches] for name in names}
    print(f"{args.requests} requests of {args.new_tokens} tokens, greedy, stand-in model: host waits a pass\n")
    print(f"| drafter | {' | '.join(f'B={b}' for b in batches)} | most waits at (B={batches[-1]}) |")
    print(f"| --- | {' | '.join('---' for _ in batches)} | --- |")
    print("\n".join(row(runs) for runs in counts.values()))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(c) for runs in counts.values() for c in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
