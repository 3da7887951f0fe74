"""One product alone: float32 stream kernel vs torch.ao dynamic int8 vs the int8 weight-only kernel (each ISA).

Shapes are SmolLM2's draft LM head (576 -> 49,152) and an MLP projection (576 -> 1,536) by default; rows 1 and 5
(a draft step, a tree depth). Clock: CPU time of this process on one thread (``time.process_time``), the kinds
interleaved round by round, the one going first rotating; medians per product and the ratio to the float stream
kernel in the same run. Also each kind's effective read rate (the bytes its weight holds over its time).

    python benchmarks/int8_product.py --threads 1 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from specfamily.runtime.int8_matmul import Int8Weight, int8_kernel
from specfamily.runtime.kernel import stream_kernel


def torch_ao(weight: torch.Tensor):
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
        from torch.ao.quantization import per_channel_dynamic_qconfig

        linear.qconfig = per_channel_dynamic_qconfig
        return DynamicLinear.from_float(linear)


def kinds_for(weight: torch.Tensor) -> dict:
    """name -> (product of x, bytes of weight it reads)."""
    n, d = weight.shape
    kinds = {}
    if stream_kernel().available:
        kinds["float stream"] = (lambda x: stream_kernel().module.linear(x, weight), n * d * 4)
    kinds["float F.linear"] = (lambda x: F.linear(x, weight), n * d * 4)
    kinds["torch.ao int8"] = (torch_ao(weight), n * d)
    if int8_kernel().available:
        packed = Int8Weight.of(weight)
        for isa in int8_kernel().module.supported_isas():
            kinds[f"int8 kernel {isa}"] = (lambda x, isa=isa: packed(x, isa), packed.nbytes)
    return kinds


@torch.inference_mode()
def measure(kinds: dict, x: torch.Tensor, rounds: int, reps: int) -> dict[str, float]:
    names = list(kinds)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds + 1):  # round 0 warms up
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            product = kinds[name][0]
            start = time.process_time()
            for _ in range(reps):
                product(x)
            if round_:
                times[name].append((time.process_time() - start) / reps)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shapes", default="576x49152,576x1536", help="comma-separated d x n")
    parser.add_argument("--rows", default="1,5")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, int8 kernel isa {int8_kernel().isa}, stream kernel isa {stream_kernel().isa}")
    generator = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        d, n = (int(v) for v in shape.split("x"))
        weight = torch.randn(n, d, generator=generator) * 0.05
        kinds = kinds_for(weight)
        reps = max(1, int(2e6 // (n * d)) * 4)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, d, generator=generator)
            seconds = measure(kinds, x, args.rounds, reps)
            base = seconds.get("float stream", seconds["float F.linear"])
            print(f"\n{d} x {n}, {rows} row(s): median of {args.rounds} rounds x {reps}")
            for name, s in seconds.items():
                rate = kinds[name][1] / s / 1e9
                print(f"  {name:22s} {s * 1e6:9.1f} us  {s / base:5.2f}x float stream  {rate:6.1f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
