"""The method's own picture, measured on this machine: verifying 5 tokens for N concurrent requests against writing 5.

Speculation pays while one pass that verifies k tokens per request costs less than the k plain passes it replaces.
For N requests decoded at once (N = ``--batch-sizes``), each holding ``--context`` tokens of a Spec-Bench prompt in
the batched cache (``core.batch_target.BatchTarget``), this times

- ``verify``: one batched pass feeding 5 tokens per request (its root and a 4-token chain), t(N, 5);
- ``write``: 5 batched passes feeding 1 token per request, 5 * t(N, 1);

medians of ``--repeats`` (the two interleaved at every N), on the CPU clock by default (one thread: steadier where
other processes share the cores). ``verify / write`` below 1 is the room a drafter has; where it reaches 1, a draft
of 4 tokens that is always accepted saves nothing. The line "after about a dozen other requests, verifying five
tokens costs as much as writing five" is the GPU's; this prints the machine's own. ``--plot`` draws both times
against N, ``--json`` keeps them.

    python benchmarks/verify_vs_write.py --threads 1 --batch-sizes 1,2,4,8,12,16,24,32 --plot docs/verify_vs_write.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.types import Draft

TOKENS = 5  # verify 5 tokens per request against writing 5


@dataclass
class Point:
    """One batch size: the median seconds of one 5-token verifying pass and of 5 one-token passes."""

    batch: int
    verify: float
    write: float

    @property
    def ratio(self) -> float:
        return self.verify / self.write if self.write > 0 else float("nan")


@dataclass
class Picture:
    threads: int
    clock: str
    context: int
    points: list[Point] = field(default_factory=list)

    def crossing(self) -> int | None:
        """The smallest N at which verifying 5 costs at least writing 5 (None: not within the batch sizes)."""
        return next((p.batch for p in self.points if p.ratio >= 1.0), None)


class Passes:
    """A batched cache of ``batch`` requests holding ``prompt``, and passes over it that leave it as it was."""

    def __init__(self, target, prompt: list[int], batch: int) -> None:
        self.engine, self.prompt, self.batch = BatchTarget(target, batch), prompt, batch
        self.engine.forward(0, [SlotFeed(torch.tensor(prompt), Draft.empty())] * batch)
        self._keep()

    def _keep(self) -> None:
        for slot in range(self.batch):
            self.engine.commit(slot, [])
        self.engine.cache.lengths[:] = [len(self.prompt)] * self.batch  # every pass sees the same cache

    def run(self, tokens: int) -> None:
        """One pass feeding ``tokens`` per request: the root and a chain of ``tokens - 1``."""
        draft = Draft.chain(self.prompt[: tokens - 1]) if tokens > 1 else Draft.empty()
        self.engine.forward(0, [SlotFeed(torch.tensor([self.prompt[-1]]), draft)] * self.batch)
        self._keep()


def measure(target, prompt: list[int], batch: int, repeats: int, clock) -> Point:
    """Medians over ``repeats`` rounds, each timing one 5-token pass and then five 1-token passes."""
    passes = Passes(target, prompt, batch)
    passes.run(TOKENS)  # warm-up of both shapes
    passes.run(1)
    verify, write = [], []
    for _ in range(repeats):
        start = clock()
        passes.run(TOKENS)
        verify.append(clock() - start)
        start = clock()
        for _ in range(TOKENS):
            passes.run(1)
        write.append(clock() - start)
    return Point(batch, statistics.median(verify), statistics.median(write))


def table(picture: Picture) -> str:
    lines = ["| N requests | verify 5 (ms) | write 5 (ms) | verify / write |", "| --- | --- | --- | --- |"]
    lines += [f"| {p.batch} | {p.verify * 1e3:.1f} | {p.write * 1e3:.1f} | {p.ratio:.2f} |" for p in picture.points]
    return "\n".join(lines)


def plot(picture: Picture, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p.batch for p in picture.points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [p.verify * 1e3 for p in picture.points], marker="o", label="verify 5 tokens per request (1 pass)")
    ax.plot(xs, [p.write * 1e3 for p in picture.points], marker="s", label="write 5 tokens per request (5 passes)")
    crossing = picture.crossing()
    if crossing is not None:
        ax.axvline(crossing, color="grey", linestyle="--", linewidth=1, label=f"verify >= write from N={crossing}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("N concurrent requests")
    ax.set_ylabel(f"milliseconds ({picture.clock} clock)")
    ax.set_title(f"verify 5 vs write 5 ({picture.threads} thread(s), {picture.context}-token context)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch-sizes", default="1,2,4,8,12,16,24,32")
    parser.add_argument("--context", type=int, default=64, help="tokens in each request's cache (a prompt's last)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plot", default="")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    quiet_transformers()
    clock = make_clock(args.clock)
    target = sf.load_target(args.target)
    prompt = spec_bench_prompts(1, target.tokenizer)[0][0][-args.context:]
    picture = Picture(args.threads, args.clock, len(prompt))
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        picture.points.append(measure(target, prompt, batch, args.repeats, clock))
        print(table(picture).splitlines()[-1], flush=True)
    print(table(picture))
    print(f"verify 5 >= write 5 from N = {picture.crossing() or 'none of these'}")
    if args.plot:
        plot(picture, args.plot)
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(picture), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
