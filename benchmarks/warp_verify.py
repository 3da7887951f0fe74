"""Sampled verification of real passes: the C++ warp against the torch warp, beside greedy verification (A/B in one
process).

The logits of chain and tree passes of SmolLM2 (``--model``) over Spec-Bench prompts (the root plus ``--nodes`` draft
tokens: the target's own greedy continuation, so walks go deep; the tree as pass_goals' two branches) are kept, then
``verify_draft`` is timed on each, arms interleaved round by round: greedy, sampled through torch ops
(``specfamily.core.sampling.torch_warp``, the chain's rows past the root in one call), sampled through the C++ warp
(``specfamily.runtime.warp_rows``, each row the walk reads alone), for every ``--sampling`` setting. The clock is
this process's CPU time (one thread); reported: the median over ``--repeats`` rounds of the mean per pass. Both
sampled arms return the same paths and tokens (checked). ``--profile``: the torch profiler's ops per pass, per arm.

    PYTHONPATH=$PWD python benchmarks/warp_verify.py --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence

import torch
from common import set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core import acceptance, sampling
from specfamily.core.acceptance import verify_draft
from specfamily.core.target import load_target
from specfamily.core.types import Draft, SamplingConfig

SETTINGS = {
    "t0.7 p0.9": SamplingConfig(0.7, top_p=0.9),
    "t1.0": SamplingConfig(1.0),
    "t0.7 k50 p0.9": SamplingConfig(0.7, top_k=50, top_p=0.9),
    "t1.0 k20": SamplingConfig(1.0, top_k=20),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=6, help="Spec-Bench prompts (one per category, in order)")
    parser.add_argument("--nodes", type=int, default=4, help="draft tokens fed with the root")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (median)")
    parser.add_argument("--profile", action="store_true", help="print the torch profiler's ops per pass, per arm")
    return parser.parse_args(argv)


def passes(args: argparse.Namespace) -> list[tuple[str, Draft, torch.Tensor]]:
    """(kind, draft, logits (n + 1, V)) of a chain and a tree pass at two cache lengths of each prompt."""
    target = load_target(args.model, device="cpu", matmul="exact")
    found = []
    with torch.inference_mode():
        for prompt in spec_bench_prompts(1, target.tokenizer)[0][: args.prompts]:
            sequence = prompt + sf.generate(target, None, prompt, max_new_tokens=32).tokens
            for offset in (4, 20):
                length = len(prompt) - 1 + offset
                if length + args.nodes + 1 > len(sequence):
                    break
                root, chain = (
                    torch.tensor(sequence[length : length + 1]),
                    torch.tensor(sequence[length + 1 : length + 1 + args.nodes]),
                )
                tree = chain.clone()
                tree[1::2], tree[0::2] = chain[: len(tree[1::2])], chain[: len(tree[0::2])]
                tree[0] = (chain[0] + 1) % target.vocab_size
                parents = torch.tensor([-1 if i < 2 else i - 2 for i in range(args.nodes)])
                for kind, draft in (("chain", Draft.chain(chain)), ("tree", Draft(tree, parents))):
                    target.reset()
                    target.forward(torch.tensor(sequence[:length]))
                    target.commit([])
                    found.append((kind, draft, target.forward(root, draft).logits.clone()))
                    target.commit([])
    return found


@contextlib.contextmanager
def torch_ops(enabled: bool) -> Iterator[None]:
    """Within: ``warp`` without the C++ warp (the torch path, and the chain's rows in one call) when ``enabled``."""
    if not enabled:
        yield
        return
    kept = sampling.warp_rows, acceptance.native_available
    sampling.warp_rows, acceptance.native_available = (lambda *a: None), (lambda: False)
    try:
        yield
    finally:
        sampling.warp_rows, acceptance.native_available = kept


def run_arm(found, kind: str, config: SamplingConfig, torch_path: bool) -> tuple[float, list]:
    """CPU seconds per pass of ``kind`` and the results."""
    results = []
    with torch_ops(torch_path):
        start = time.process_time()
        for seed, (k, draft, logits) in enumerate(found):
            if k == kind:
                results.append(verify_draft(draft, logits, config, torch.Generator().manual_seed(seed)))
        return (time.process_time() - start) / len(results), results


def arms() -> list[tuple[str, SamplingConfig, bool]]:
    return [("greedy", SamplingConfig(), False)] + [
        (f"{name} {path}", config, path == "torch") for name, config in SETTINGS.items() for path in ("torch", "c++")
    ]


def measure(found, repeats: int) -> dict[str, dict[str, float]]:
    """kind -> arm -> median ms per pass, arms rotated round by round."""
    table: dict[str, dict[str, float]] = {}
    for kind in ("chain", "tree"):
        every = arms()
        times: dict[str, list[float]] = {name: [] for name, _, _ in every}
        for round_ in range(repeats + 1):
            shift = round_ % len(every)
            outcome = {}
            for name, config, torch_path in every[shift:] + every[:shift]:
                seconds, outcome[name] = run_arm(found, kind, config, torch_path)
                if round_:
                    times[name].append(seconds)
            for setting in SETTINGS:
                assert outcome[f"{setting} torch"] == outcome[f"{setting} c++"], setting
        table[kind] = {name: 1e3 * statistics.median(values) for name, values in times.items()}
    return table


def profile_ops(found, kind: str, config: SamplingConfig, torch_path: bool, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    count = sum(k == kind for k, _, _ in found)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            run_arm(found, kind, config, torch_path)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:rows]
    return "\n".join(
        f"  {e.key:28s} {e.self_cpu_time_total / 3 / count:8.1f} us/pass  {e.count / 3 / count:5.1f} calls"
        for e in events
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    set_threads(args.threads)
    found = passes(args)
    table = measure(found, args.repeats)
    print(
        f"{args.model}, {args.threads} thread(s), {len(found) // 2} passes of each kind, {args.nodes} nodes, "
        f"median of {args.repeats} rounds, CPU ms per pass"
    )
    print("| arm | chain | tree |\n|---|---:|---:|")
    for name in table["chain"]:
        print(f"| {name} | {table['chain'][name]:.3f} | {table['tree'][name]:.3f} |")
    if args.profile:
        for name, config, torch_path in arms():
            print(f"chain, {name} (profiler: self CPU per pass, with the profiler's own overhead)")
            print(profile_ops(found, "chain", config, torch_path))


if __name__ == "__main__":
    main()
