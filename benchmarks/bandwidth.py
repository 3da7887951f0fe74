"""The floor of one target pass on this machine, and each matmul kind's time beside it, by pass size.

A pass over a few tokens reads every weight once; on a CPU at batch 1 its time is bounded below by the bytes it
reads divided by the machine's read bandwidth. This script measures, in one process at a fixed thread count:

- the read bandwidth: the faster of a sum over a float32 tensor of ``--gb`` GB and the stream kernel's one-row product
  over a weight of that size, each best of ``--repeats`` (read again and again, as a pass reads its weights: on a
  machine whose last-level cache holds much of the probe, so it does the weights);
- the weights one pass reads: every linear weight of SmolLM2 (30 decoder layers and the tied LM head), from the
  fetched ``zoo:smollm2`` when it is in the cache, else random tensors of its shapes (``--weights``);
- per pass size k = g + 1 (``--sizes``), the time of one product per weight for each matmul kind (exact = F.linear,
  skinny, stream = the C++ kernel of ``specfamily.runtime.kernel``, whose packed copies of the weights are made in the
  warm-up round and reported as its memory cost), kinds interleaved, best of ``--repeats``;

and prints them beside the floor (bytes / bandwidth), with t(k)/t(1) per kind. Numbers are only as quiet as the
machine: say so when others share it.

    python benchmarks/bandwidth.py --threads 2 [--weights random] [--json bandwidth.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from specfamily.runtime.kernel import drop_packed, packed_bytes, stream_kernel
from specfamily.runtime.matmul import skinny_linear, stream_linear

SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


@dataclass(frozen=True)
class Shapes:
    """A Llama's linear weight shapes: what one pass reads."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int  # the (tied) LM head's rows

    def weights(self) -> list[tuple[int, int]]:
        """(out, in) of every linear weight, in the order a pass reads them."""
        head_dim = self.hidden // self.heads
        q, kv = self.heads * head_dim, self.kv_heads * head_dim
        layer = [(q, self.hidden), (kv, self.hidden), (kv, self.hidden), (self.hidden, q),
                 (self.intermediate, self.hidden), (self.intermediate, self.hidden), (self.hidden, self.intermediate)]
        return layer * self.layers + [(self.vocab, self.hidden)]


SHAPES = {
    "smollm2": Shapes(hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, vocab=49152),
    "tiny": Shapes(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=256),  # the smoke test's
}


@dataclass
class Report:
    """What one run measured: bandwidth, bytes, and per kind the best seconds by pass size."""

    threads: int
    weights: str  # where the weights came from
    bytes_read: int  # one pass: every linear weight once
    bandwidth: float  # bytes / s
    seconds: dict[str, dict[int, float]] = field(default_factory=dict)  # kind -> k -> best s
    unavailable: dict[str, str] = field(default_factory=dict)  # kind -> why it was not timed
    isa: str | None = None  # the stream kernel's instruction set
    packed_bytes: int = 0  # the stream kernel's packed copies of the weights: its memory cost
    probes: dict[str, float] = field(default_factory=dict)  # each bandwidth probe's bytes / s (bandwidth: the best)

    @property
    def floor(self) -> float:
        return self.bytes_read / self.bandwidth


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="best of this many rounds (each kind, each size)")
    parser.add_argument("--gb", type=float, default=1.0, help="size of the bandwidth probe tensor, GB")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="pass sizes k = g + 1, comma-separated")
    parser.add_argument("--weights", choices=("auto", "zoo", "random"), default="auto",
                        help="zoo: the fetched zoo:smollm2's weights; random: tensors of --shape; auto: zoo if fetched")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="shapes of random weights")
    parser.add_argument("--json", type=Path, help="also write the report here")
    return parser.parse_args(argv)


def read_bandwidth(gb: float, repeats: int) -> float:
    """Bytes per second of a sum over ``gb`` GB of float32, best of ``repeats`` (after one warm-up)."""
    data = torch.ones(max(1, int(gb * 1e9) // 4), dtype=torch.float32)
    best = float("inf")
    for round_ in range(repeats + 1):
        start = time.perf_counter()
        data.sum()
        if round_:
            best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def kernel_read_bandwidth(gb: float, repeats: int, width: int = 576) -> float | None:
    """Bytes per second of the stream kernel reading a ``gb``-GB float32 weight in a one-row product (one FMA per
    element, its lines fetched ahead: the fastest reader of weights this project has), best of ``repeats`` after the
    warm-up call that packs it; None where the kernel is not available (no compiler, no x86)."""
    if not stream_kernel().available:
        return None
    weight = torch.ones(max(1, int(gb * 1e9) // 4 // width), width)
    row = torch.ones(1, width)
    best = float("inf")
    for round_ in range(repeats + 1):
        start = time.perf_counter()
        stream_linear(row, weight)
        if round_:
            best = min(best, time.perf_counter() - start)
    read = packed_bytes([weight])
    drop_packed([weight])
    return read / best


def floor_bandwidth(gb: float, repeats: int) -> tuple[float, dict[str, float]]:
    """The machine's read bandwidth over a working set of ``gb`` GB read again and again (as a pass reads its weights):
    the faster of a torch sum and the stream kernel's one-row product, with each probe's bytes per second."""
    probes = {"sum": read_bandwidth(gb, repeats)}
    kernel = kernel_read_bandwidth(gb, repeats)
    if kernel is not None:
        probes["stream product"] = kernel
    return max(probes.values()), probes


def zoo_weights() -> list[torch.Tensor] | None:
    """zoo:smollm2's linear weights (the tied head last) if it is fetched, else None (never fetches)."""
    from safetensors.torch import load_file

    from specfamily.zoo.fetch import cache_folder

    path = cache_folder("smollm2") / "model.safetensors"
    if not path.is_file():
        return None
    tensors = load_file(str(path))
    linears = [t for name, t in tensors.items() if name.endswith("proj.weight")]
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    return [t.float().contiguous() for t in [*linears, head]]


def random_weights(shapes: Shapes, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(out, inp, generator=generator) * inp**-0.5 for out, inp in shapes.weights()]


def load_weights(args: argparse.Namespace) -> tuple[list[torch.Tensor], str]:
    if args.weights in ("auto", "zoo") and args.shape == "smollm2":
        found = zoo_weights()
        if found is not None:
            return found, "zoo:smollm2"
        if args.weights == "zoo":
            raise SystemExit("zoo:smollm2 is not fetched: run `specfamily-zoo fetch smollm2` or use --weights random")
    return random_weights(SHAPES[args.shape]), f"random, {args.shape} shapes"


def kinds() -> tuple[dict[str, Callable[..., torch.Tensor]], dict[str, str]]:
    """The matmul kinds to time, and those that cannot be (with why)."""
    available = {"exact": F.linear, "skinny": skinny_linear}
    kernel = stream_kernel()
    if kernel.available:
        available["stream"] = stream_linear
        return available, {}
    return available, {"stream": str(kernel.reason)}


@torch.inference_mode()
def time_sizes(weights: Sequence[torch.Tensor], linears: dict[str, Callable[..., torch.Tensor]],
               sizes: Sequence[int], repeats: int) -> dict[str, dict[int, float]]:
    """kind -> k -> best seconds of one product per weight, the kinds interleaved round by round."""
    generator = torch.Generator().manual_seed(1)
    best: dict[str, dict[int, float]] = {name: {} for name in linears}
    for k in sizes:
        inputs = {d: torch.randn(k, d, generator=generator) for d in {w.shape[1] for w in weights}}
        names = list(linears)
        for round_ in range(repeats + 1):  # round 0 warms up
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                for weight in weights:
                    linears[name](inputs[weight.shape[1]], weight)
                elapsed = time.perf_counter() - start
                if round_:
                    best[name][k] = min(best[name].get(k, float("inf")), elapsed)
    return best


def measure(args: argparse.Namespace) -> Report:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip().isdigit()]
    if len(sizes) != len(args.sizes.split(",")) or min(sizes, default=0) < 1:
        raise SystemExit(f"--sizes must be positive integers, got {args.sizes!r}")
    torch.set_num_threads(args.threads)
    bandwidth, probes = floor_bandwidth(args.gb, args.repeats)
    weights, source = load_weights(args)
    linears, unavailable = kinds()
    seconds = time_sizes(weights, linears, sizes, args.repeats)
    return Report(args.threads, source, sum(w.numel() * w.element_size() for w in weights), bandwidth, seconds,
                  unavailable, stream_kernel().isa, packed_bytes(weights), probes)


def markdown(report: Report) -> str:
    """The curve beside the floor: ms by pass size, t(k)/t(1), and the one-row time over the floor."""
    sizes = sorted(next(iter(report.seconds.values())))
    head = "| kind | " + " | ".join(f"k={k}" for k in sizes) + " | t(1) / floor |"
    lines = [f"{report.threads} thread(s); weights {report.weights}, {report.bytes_read / 1e6:.0f} MB per pass; "
             f"read bandwidth {report.bandwidth / 1e9:.1f} GB/s ({probe_text(report.probes)}); "
             f"floor {report.floor * 1e3:.2f} ms; "
             f"stream kernel: {report.isa or 'unavailable'}"
             + (f" (packed copies: {report.packed_bytes / 1e6:.0f} MB more)" if report.packed_bytes else ""),
             "", "ms per pass (best of the rounds):", "",
             head, "|---" * (len(sizes) + 2) + "|",
             "| floor | " + " | ".join(f"{report.floor * 1e3:.2f}" for _ in sizes) + " | 1.00 |"]
    for name, by_k in report.seconds.items():
        cells = " | ".join(f"{by_k[k] * 1e3:.2f}" for k in sizes)
        lines.append(f"| {name} | {cells} | {by_k[sizes[0]] / report.floor:.2f} |")
    lines += ["", "t(k) / t(1):", "", "| kind | " + " | ".join(f"k={k}" for k in sizes) + " |",
              "|---" * (len(sizes) + 1) + "|"]
    for name, by_k in report.seconds.items():
        lines.append(f"| {name} | " + " | ".join(f"{by_k[k] / by_k[sizes[0]]:.2f}" for k in sizes) + " |")
    lines += [f"\n{name}: not timed ({why})" for name, why in report.unavailable.items()]
    return "\n".join(lines)


def probe_text(probes: dict[str, float]) -> str:
    """'sum 28.1 GB/s, stream product 30.2 GB/s': what each bandwidth probe read."""
    return ", ".join(f"{name} {value / 1e9:.1f} GB/s" for name, value in probes.items())


def main(argv: Sequence[str] | None = None) -> Report:
    args = parse_args(argv)
    report = measure(args)
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=1) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
