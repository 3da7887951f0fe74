"""Batched decoding by load: tokens/s of every drafter against plain batched decoding and transformers' generate.

For each batch size B (``--batch-sizes``), the first R B prompts (Spec-Bench first turns through the chat template,
``--per-category`` questions of each of its 13 categories, cut to their last ``--max-prompt-tokens``, 0: whole; R =
``--requests-per-slot``) are decoded greedily (or sampled: ``--temperature``, ``--top-k``, ``--top-p``, request i
seeded i, transformers' generate sampling too), ``--max-new-tokens`` each, at most B at once (``max_batch=B``: a request
that finishes makes room for a waiting one, so with R > 1 the batch stays full until the queue runs dry, as a server at
concurrency B; with R = 1 every request starts together and the batch runs as many passes as its slowest request needs),
in one process at a fixed thread count and matmul kind (``--matmul``):

- ``hf``: transformers' ``generate`` on the same prompts in batches of B, left-padded with an attention mask (its
  tokens up to each row's EOS are counted);
- ``plain``: ``sf.generate_batch`` without a drafter (one pass per step over every live request);
- each drafter at its defaults (``sf.create_drafter(name, target)``), through ``sf.generate_batch``;

methods interleaved within each round (each round starting one method later than the one before, so that no method
always runs first; plain ``--plain-runs`` times a round, default 3, spread through it: its runs' mean is the reference
of every drafter's ratio in the round; hf in the first ``--hf-rounds`` timed rounds only, if given), ``--warmup``
untimed rounds at every B (default 1: a B's first run meets new pass shapes and learns t(B, n)), then ``--repeats``
timed rounds, the median time kept. Tokens/s counts each request's new tokens; greedy, every drafter's tokens are
compared with plain batched decoding's, request by request (sampled, they are not: ``sampling_of``). The table gives
each method's tokens/s and its ratio to plain batched decoding at the same B (medians' ratio; with two or more rounds,
after it, the 95% t interval of the mean of the rounds' own ratios: each round runs every method back to back, so the
interval says whether a cell's gap to 1 is more than the machine's drift), and each drafter's crossover (the smallest B
at which it is slower than plain); a second table gives each arm's target passes over its requests (the prefill passes
included) and tau (new tokens per pass, summed over the requests). Beside it, the method's own picture measured here:
the time of one batched pass feeding 5 tokens per request against one feeding 1 (t(B, 5) / t(B, 1)), and the batched
cache's bytes per request at the capacity these runs preallocate. ``--plot`` writes speedup against B per drafter with
the crossovers marked. Numbers are as quiet as the machine: the CPU clock (``--clock cpu``, one thread) is steadier
where other processes share the cores.

    python benchmarks/batch_sweep.py --threads 1 --matmul stream --batch-sizes 1,2,4,8,16,32 --plot docs/batching.png

The default run's workload (``configs/dataset/spec_bench.yaml``: one question a category, whole prompts, 128 new
tokens): ``--per-category 1 --max-prompt-tokens 0 --max-new-tokens 128``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from common import workload
from sweep_results import Row, Sweep, floor_verdict, passes_table, plot, table

import specfamily as sf
from specfamily.core.batch_loop import cache_capacity
from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.types import Draft, SamplingConfig
from specfamily.eval.batching import poisson_arrivals

PASS_TOKENS = 5  # the method's picture: verify 5 tokens per request against writing 1


def hf_batch(model, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...],
             sampling: SamplingConfig | None = None) -> list[list[int]]:
    """transformers' generate on the left-padded batch, greedy or as ``sampling`` warps (temperature, top-k,
    top-p): each row's new tokens up to its first EOS."""
    width, device = max(len(p) for p in prompts), next(model.parameters()).device
    pad = eos[0] if eos else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             **hf_sampling(sampling))
    rows = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if end is None else row[: end + 1])
    return rows


def hf_sampling(sampling: SamplingConfig | None) -> dict:
    """transformers' generate arguments for ``sampling`` (None or temperature 0: greedy). Every warp is given, off
    ones too (top-k 0, top-p 1): left out, transformers fills in its defaults (top-k 50)."""
    if sampling is None or sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}


def pass_ratio(target, prompt: list[int], batch: int, repeats: int, clock) -> float:
    """t(B, 5) / t(B, 1): one batched pass feeding 5 tokens per request (a root and a 4-token chain) against 1,
    over B caches holding ``prompt``; medians of ``repeats``."""
    one, five = pass_seconds(target, prompt, batch, repeats, clock)
    return five / one


def pass_seconds(target, prompt: list[int], batch: int, repeats: int, clock) -> tuple[float, float]:
    """(t(B, 1), t(B, 5)) in seconds, as :func:`pass_ratio` measures them."""
    engine = BatchTarget(target, batch)
    engine.forward(0, [SlotFeed(torch.tensor(prompt), Draft.empty())] * batch)
    for slot in range(batch):
        engine.commit(slot, [])

    def timed(n: int) -> float:
        feeds = [SlotFeed(torch.tensor([prompt[-1]]), Draft.chain(prompt[:n - 1]) if n > 1 else Draft.empty())] * batch
        times = []
        for _ in range(repeats):
            start = clock()
            engine.forward(0, feeds)
            times.append(clock() - start)
            for slot in range(batch):
                engine.commit(slot, [])
            engine.cache.lengths[:] = [len(prompt)] * batch  # back to the prompt: every pass sees the same cache
        return statistics.median(times)

    timed(1)
    return timed(1), timed(PASS_TOKENS)


def run_round(target, names: list[str], prompts: list[list[int]], args, clock, times: dict, hf: bool = True) -> None:
    """One round at one batch size: hf (unless ``hf`` is false), plain, each drafter (a fresh one: suffix's cache
    must not have seen these prompts' outputs in an earlier round), interleaved; times appended to ``times``. With
    ``--arrival-rate`` the requests arrive as a seeded Poisson process (the same for every method) and hf, which
    cannot take arrivals, is left out, as it is with ``--no-hf``."""
    batch = len(prompts) // args.requests_per_slot
    arrivals = poisson_arrivals(len(prompts), args.arrival_rate, seed=0)
    sampling = sampling_of(args)
    if hf and arrivals is None and not args.no_hf:
        start = clock()
        hf_rows = [row for i in range(0, len(prompts), batch)
                   for row in hf_batch(target.model, prompts[i:i + batch], args.max_new_tokens, target.eos_token_ids,
                                       sampling)]
        times.setdefault("hf", []).append((clock() - start, sum(map(len, hf_rows)), 0, float("nan"), 0))
    methods = ["plain", *names]
    shift = len(times.get("plain", ())) % len(methods)  # each round starts one method later: no method always first
    runs: dict[str, list] = {}
    for name in round_order(methods[shift:] + methods[:shift], args.plain_runs):
        drafter = None if name == "plain" else make_drafter(name, target, args.gamma)  # loading is not timed
        start = clock()
        results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens, sampling, max_batch=batch,
                                    arrivals=arrivals)
        runs.setdefault(name, []).append((clock() - start, results))
    plain = [r.tokens for r in runs["plain"][0][1]]
    for name in methods:
        seconds, results = statistics.mean(s for s, _ in runs[name]), runs[name][0][1]
        out = [r.tokens for r in results]
        if sampling.greedy and any([r.tokens for r in again] != plain for _, again in runs[name][1:]):
            raise RuntimeError(f"{name}: its runs in one round decoded different tokens")
        mismatched = sum(a != b for a, b in zip(out, plain, strict=True)) if sampling.greedy else 0
        latency = statistics.median(r.metrics.finish_s - r.metrics.arrival_s for r in results)
        passes = sum(r.metrics.target_passes for r in results)
        times.setdefault(name, []).append((seconds, sum(map(len, out)), mismatched, latency, passes))


def round_order(methods: list[str], plain_runs: int) -> list[str]:
    """``methods`` (plain among them once) with plain run ``plain_runs`` times (at most as many as methods), spread
    through the round from where it stands. Plain's time is every drafter's reference in the round, so their ratios
    share its noise (one lucky plain run moves every drafter's cell at a batch size together: docs/batching-log.md,
    session 33); it runs more often than any one drafter and its runs' mean is the round's reference."""
    if plain_runs < 1:
        raise ValueError(f"--plain-runs must be at least 1, got {plain_runs}")
    start, slots = methods.index("plain"), len(methods)
    runs = min(plain_runs, slots)
    marks = {(start + k * slots // runs) % slots for k in range(runs)}  # indices into ``methods``
    order = []
    for index, name in enumerate(methods):
        if index in marks and name != "plain":
            order.append("plain")
        order.append(name)
    return order


def sampling_of(args) -> SamplingConfig:
    """The sweep's sampling (``--temperature``, ``--top-k``, ``--top-p``; temperature 0: greedy). Sampled texts are
    not compared with plain decoding's: a request draws its tokens from its own seeded generator, and how many draws a
    pass makes follows its draft lengths, so its text is one draw of the target's law, not plain decoding's text (the
    conformance kit tests each request's law inside a batch)."""
    return SamplingConfig(getattr(args, "temperature", 0.0), getattr(args, "top_k", 0), getattr(args, "top_p", 1.0))


def make_drafter(name: str, target, gamma: int | None):
    """The drafter at its defaults, or, with ``gamma``, drafting ``gamma`` tokens on every pass (a constant policy:
    the batch's length policy, which plans only cost-aware drafters, leaves it alone)."""
    return sf.create_drafter(name, target) if gamma is None else sf.create_drafter(name, target, gamma=gamma)


def sweep(args) -> Sweep:
    if args.hf_rounds is not None and args.hf_rounds < 1:  # refused before the target loads
        raise ValueError(f"--hf-rounds must be at least 1, got {args.hf_rounds} (--no-hf leaves hf out)")
    sampling = sampling_of(args)  # refused before the target loads
    clock, target, prompts = workload(args)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if max(batches) * args.requests_per_slot > len(prompts):
        raise ValueError(f"{len(prompts)} prompts, batch sizes up to {max(batches)} x {args.requests_per_slot}")
    result = Sweep(args.threads, args.clock, args.max_new_tokens, args.matmul, args.max_prompt_tokens,
                   args.per_category, [len(p) for p in prompts], args.requests_per_slot, args.arrival_rate,
                   plain_runs=args.plain_runs, hf_rounds=args.hf_rounds, categories=args.categories,
                   sampling=asdict(sampling))
    names = args.drafters.split(",") if args.drafters else sf.list_drafters()
    for name in list(names):
        try:
            make_drafter(name, target, args.gamma)
        except ValueError as err:  # no shipped weights for this target
            result.skipped[name] = str(err).split(";")[0]
            names.remove(name)
    for batch in batches:
        chosen = prompts[:batch * args.requests_per_slot]
        times: dict[str, list] = {}
        for _ in range(args.warmup):  # every B: its pass shapes and t(B, n) are new to the first run at it
            run_round(target, names, chosen, args, clock, {})
        for index in range(args.repeats):
            run_round(target, names, chosen, args, clock, times, hf=args.hf_rounds is None or index < args.hf_rounds)
        plain = times["plain"]
        for method, rounds in times.items():
            paired = [(p[0] / p[1]) / (r[0] / r[1]) if r[1] and p[1] else float("nan")
                      for r, p in zip(rounds, plain[: len(rounds)], strict=True)]  # over plain's, round by round
            result.rows.append(Row(method, batch, statistics.median(r[0] for r in rounds), rounds[-1][1],
                                   max(r[2] for r in rounds), statistics.median(r[3] for r in rounds),
                                   rounds[-1][4], paired, [r[1] / r[4] for r in rounds if r[4]]))
        result.pass_ratio[batch] = pass_ratio(target, chosen[0], batch, args.repeats * 3, clock)
        print(table(result, batches), flush=True)
        print(passes_table(result, batches), flush=True)
    engine = BatchTarget(target, 1, cache_capacity([len(p) for p in prompts], args.max_new_tokens))
    engine.forward(0, [SlotFeed(torch.tensor(prompts[0]), Draft.empty())])
    engine.commit(0, [])
    result.cache_bytes_per_request = engine.cache.bytes_per_slot()
    result.cache_capacity = engine.cache.capacity
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--matmul", default="exact", help="the target's matmul kind: exact, skinny, stream, auto")
    parser.add_argument("--requests-per-slot", type=int, default=1,
                        help="R: R*B requests at max_batch=B (R > 1: a queue keeps the batch full)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--drafters", default="", help="comma-separated (default: every registered drafter)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-tokens", type=int, default=96, help="keep each prompt's last N tokens; 0: whole")
    parser.add_argument("--per-category", type=int, default=3,
                        help="Spec-Bench questions per category (13 categories; the default run: 1)")
    parser.add_argument("--categories", default=None,
                        help="comma-separated Spec-Bench categories to keep (e.g. summarization,rag: input-grounded "
                             "tasks, where copy drafters find their matches); default: all 13")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample at this temperature (default 0: greedy, texts compared with plain decoding's)")
    parser.add_argument("--top-k", type=int, default=0, help="with --temperature: keep the k most probable (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature: nucleus mass (1: off)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones, at every B")
    parser.add_argument("--plain-runs", type=int, default=3,
                        help="plain's runs a round, spread through it (their mean: every drafter's reference)")
    parser.add_argument("--gamma", type=int, default=None,
                        help="every drafter at this constant draft length (default: its own, cost-aware)")
    parser.add_argument("--arrival-rate", type=float, default=None,
                        help="requests per second, seeded Poisson arrivals (default: all at once); leaves hf out")
    parser.add_argument("--no-hf", action="store_true", help="leave transformers' generate out")
    parser.add_argument("--hf-rounds", type=int, default=None,
                        help="time hf in the first N rounds only (default: every round; it runs 2x plain's time, "
                             "far from plain: fewer rounds buy the drafters' cells more rounds in the same time)")
    parser.add_argument("--plot", default="")
    parser.add_argument("--json", default="")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = sweep(args)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    print(table(result, batches))
    print(passes_table(result, batches))
    print(floor_verdict(result, batches))
    print(f"prompt tokens: {result.prompt_tokens}")
    print(f"batched cache per request: {result.cache_bytes_per_request / 2**20:.1f} MiB at {result.cache_capacity} "
          f"entries ({result.cache_bytes_per_request // max(result.cache_capacity, 1) / 2**10:.1f} KiB per token); "
          f"matmul {args.matmul}; {args.requests_per_slot} request(s) per slot; skipped: {result.skipped}")
    print("greedy: every drafter's text compared with plain decoding's" if sampling_of(args).greedy else
          f"sampled ({result.sampling}): texts not compared (each is one draw of the target's law)")
    if args.plot:
        plot(result, batches, args.plot)
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(result)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
