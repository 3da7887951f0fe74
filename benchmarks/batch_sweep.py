"""Batched decoding by load: tokens/s of every drafter against plain batched decoding and transformers' generate.

For each batch size B (``--batch-sizes``), the first R B prompts (Spec-Bench first turns through the chat template,
``--per-category`` questions of each of its 13 categories, cut to their last ``--max-prompt-tokens``, 0: whole; R =
``--requests-per-slot``) are decoded greedily, ``--max-new-tokens`` each, at most B at once (``max_batch=B``: a request
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
timed rounds, the median time kept. Tokens/s counts each request's new tokens; every drafter's tokens are compared with
plain batched decoding's, request by request. The table gives each method's tokens/s and its ratio to plain batched
decoding at the same B (medians' ratio; with two or more rounds, after it, the 95% t interval of the mean of the rounds'
own ratios: each round runs every method back to back, so the interval says whether a cell's gap to 1 is more than the
machine's drift), and each drafter's crossover (the smallest B at which it is slower than plain); a second table gives
each arm's target passes over its requests (the prefill passes included) and tau (new tokens per pass, summed over the
requests). Beside it, the method's own picture measured here: the time of one batched pass feeding 5 tokens per request
against one feeding 1 (t(B, 5) / t(B, 1)), and the batched cache's bytes per request at the capacity these runs
preallocate. ``--plot`` writes speedup against B per drafter with the crossovers marked. Numbers are as quiet as the
machine: the CPU clock (``--clock cpu``, one thread) is steadier where other processes share the cores.

    python benchmarks/batch_sweep.py --threads 1 --matmul stream --batch-sizes 1,2,4,8,16,32 --plot docs/batching.png

The default run's workload (``configs/dataset/spec_bench.yaml``: one question a category, whole prompts, 128 new
tokens): ``--per-category 1 --max-prompt-tokens 0 --max-new-tokens 128``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from common import paired_interval, workload

import specfamily as sf
from specfamily.core.batch_loop import cache_capacity
from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.types import Draft
from specfamily.eval.batching import poisson_arrivals
from specfamily.eval.plots import line_style

PASS_TOKENS = 5  # the method's picture: verify 5 tokens per request against writing 1


@dataclass
class Row:
    """One method at one batch size."""

    method: str
    batch: int
    seconds: float  # median over rounds
    tokens: int  # new tokens over the batch
    mismatched: int = 0  # requests whose tokens differ from plain batched decoding's (drafters)
    latency: float = float("nan")  # median over rounds of the median request's latency, wall seconds (not hf)
    passes: int = 0  # target passes over the batch's requests, prefill included (last round; not hf)
    rounds: list[float] = field(default_factory=list)  # tokens/s over plain's in the same round, round by round
    round_taus: list[float] = field(default_factory=list)  # tau round by round (a policy may draft in some only)

    @property
    def tau(self) -> float:
        """New tokens per target pass over the requests (nan for hf, whose passes are not counted)."""
        return self.tokens / self.passes if self.passes else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Sweep:
    threads: int
    clock: str
    max_new_tokens: int
    matmul: str = "exact"
    max_prompt_tokens: int = 0  # 0: whole prompts
    per_category: int = 3
    prompt_tokens: list[int] = field(default_factory=list)  # each prompt's length, in order
    requests_per_slot: int = 1
    arrival_rate: float | None = None  # requests per second (None: all at once)
    rows: list[Row] = field(default_factory=list)
    pass_ratio: dict[int, float] = field(default_factory=dict)  # B -> t(B, 5) / t(B, 1)
    cache_bytes_per_request: int = 0  # at the capacity generate_batch preallocates for these prompts
    cache_capacity: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    plain_runs: int = 1  # plain's runs a round (their mean: the round's reference)
    hf_rounds: int | None = None  # the timed rounds hf ran in, the first ones (None: every one)
    categories: str | None = None  # the Spec-Bench categories kept, comma-separated (None: all)

    def tps(self, method: str, batch: int) -> float | None:
        row = next((r for r in self.rows if r.method == method and r.batch == batch), None)
        return None if row is None else row.tokens_per_second

    def speedup(self, method: str, batch: int) -> float | None:
        ours, plain = self.tps(method, batch), self.tps("plain", batch)
        return None if ours is None or not plain else ours / plain

    def interval(self, method: str, batch: int) -> tuple[float, float] | None:
        """The 95% t interval of the mean per-round ratio to plain (:func:`paired_interval`), None for plain."""
        row = next((r for r in self.rows if r.method == method and r.batch == batch), None)
        return None if row is None or method == "plain" else paired_interval(row.rounds)

    def crossover(self, method: str, batches: list[int]) -> int | None:
        return next((b for b in batches if (s := self.speedup(method, b)) is not None and s < 1.0), None)


def hf_batch(model, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...]) -> list[list[int]]:
    """transformers' greedy generate on the left-padded batch: each row's new tokens up to its first EOS."""
    width, device = max(len(p) for p in prompts), next(model.parameters()).device
    pad = eos[0] if eos else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=pad)
    rows = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if end is None else row[: end + 1])
    return rows


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
    if hf and arrivals is None and not args.no_hf:
        start = clock()
        hf_rows = [row for i in range(0, len(prompts), batch)
                   for row in hf_batch(target.model, prompts[i:i + batch], args.max_new_tokens, target.eos_token_ids)]
        times.setdefault("hf", []).append((clock() - start, sum(map(len, hf_rows)), 0, float("nan"), 0))
    methods = ["plain", *names]
    shift = len(times.get("plain", ())) % len(methods)  # each round starts one method later: no method always first
    runs: dict[str, list] = {}
    for name in round_order(methods[shift:] + methods[:shift], args.plain_runs):
        drafter = None if name == "plain" else make_drafter(name, target, args.gamma)  # loading is not timed
        start = clock()
        results = sf.generate_batch(target, drafter, prompts, args.max_new_tokens, max_batch=batch, arrivals=arrivals)
        runs.setdefault(name, []).append((clock() - start, results))
    plain = [r.tokens for r in runs["plain"][0][1]]
    for name in methods:
        seconds, results = statistics.mean(s for s, _ in runs[name]), runs[name][0][1]
        if any([r.tokens for r in again] != plain for _, again in runs[name][1:]):
            raise RuntimeError(f"{name}: its runs in one round decoded different tokens")
        out = [r.tokens for r in results]
        mismatched = sum(a != b for a, b in zip(out, plain, strict=True))
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


def make_drafter(name: str, target, gamma: int | None):
    """The drafter at its defaults, or, with ``gamma``, drafting ``gamma`` tokens on every pass (a constant policy:
    the batch's length policy, which plans only cost-aware drafters, leaves it alone)."""
    return sf.create_drafter(name, target) if gamma is None else sf.create_drafter(name, target, gamma=gamma)


def sweep(args) -> Sweep:
    if args.hf_rounds is not None and args.hf_rounds < 1:  # refused before the target loads
        raise ValueError(f"--hf-rounds must be at least 1, got {args.hf_rounds} (--no-hf leaves hf out)")
    clock, target, prompts = workload(args)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if max(batches) * args.requests_per_slot > len(prompts):
        raise ValueError(f"{len(prompts)} prompts, batch sizes up to {max(batches)} x {args.requests_per_slot}")
    result = Sweep(args.threads, args.clock, args.max_new_tokens, args.matmul, args.max_prompt_tokens,
                   args.per_category, [len(p) for p in prompts], args.requests_per_slot, args.arrival_rate,
                   plain_runs=args.plain_runs, hf_rounds=args.hf_rounds, categories=args.categories)
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


def table(result: Sweep, batches: list[int]) -> str:
    methods = [m for m in ("plain", "hf") if any(r.method == m for r in result.rows)]
    methods += [m for m in dict.fromkeys(r.method for r in result.rows) if m not in ("plain", "hf")]
    done = [b for b in batches if result.tps("plain", b) is not None]
    lines = ["| method | " + " | ".join(f"B={b}" for b in done) + " | crossover |",
             "| --- |" + " --- |" * (len(done) + 1)]
    for method in methods:
        cells = []
        for b in done:
            tps, ratio = result.tps(method, b), result.speedup(method, b)
            row = next((r for r in result.rows if r.method == method and r.batch == b), None)
            mark = f" ({row.mismatched} differ)" if row is not None and row.mismatched else ""
            if row is not None and result.arrival_rate is not None:
                mark += f", latency {row.latency:.2f} s"
            ci = result.interval(method, b)
            spread = "" if ci is None else f", {ci[0]:.2f}-{ci[1]:.2f}"
            cells.append("-" if tps is None else f"{tps:.1f} tok/s ({ratio:.2f}x{spread}){mark}")
        cross = "" if method == "plain" else str(result.crossover(method, done) or f"none up to {done[-1]}")
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {cross} |")
    lines.append("| t(B,5)/t(B,1) | " + " | ".join(f"{result.pass_ratio.get(b, float('nan')):.2f}" for b in done)
                 + " | |")
    return "\n".join(lines)


def floor_verdict(result: Sweep, batches: list[int], floor: float = 0.98) -> str:
    """Issue 33's goal "each drafter at its defaults >= ``floor`` x plain at every batch size", judged cell by cell
    on the 95% interval of its rounds' ratios: under (the whole interval below the floor: a measured loss), unsure
    (the median below, the interval reaching over: not told apart from the floor) or met."""
    under, unsure = [], []
    for row in result.rows:
        if row.method in ("plain", "hf") or row.batch not in batches:
            continue
        ratio, ci = result.speedup(row.method, row.batch), result.interval(row.method, row.batch)
        cell = f"{row.method} B={row.batch} {ratio:.3f}"
        if ci is not None and ci[1] < floor:
            under.append(f"{cell} ({ci[0]:.3f}-{ci[1]:.3f})")
        elif ratio < floor:
            unsure.append(cell if ci is None else f"{cell} ({ci[0]:.3f}-{ci[1]:.3f})")
    return (f">= {floor}x at every B: {'met' if not under and not unsure else 'not shown'}; measurably under "
            f"(interval below {floor}): {', '.join(under) or 'none'}; median under, interval reaching {floor}: "
            f"{', '.join(unsure) or 'none'}")


def passes_table(result: Sweep, batches: list[int]) -> str:
    """Each arm's target passes over its requests (prefill included) and tau in the last round, per batch size (hf has
    none), with the range of its rounds' taus where they differ (a cost-aware policy may draft in some rounds only)."""
    done = [b for b in batches if result.tps("plain", b) is not None]
    methods = [m for m in dict.fromkeys(r.method for r in result.rows) if m != "hf"]
    lines = ["| passes (tau) | " + " | ".join(f"B={b}" for b in done) + " |", "| --- |" + " --- |" * len(done)]
    for method in methods:
        rows = [next((r for r in result.rows if r.method == method and r.batch == b), None) for b in done]
        lines.append(f"| {method} | " + " | ".join("-" if r is None else _passes_cell(r) for r in rows) + " |")
    return "\n".join(lines)


def _passes_cell(row: Row) -> str:
    low, high = min(row.round_taus, default=row.tau), max(row.round_taus, default=row.tau)
    spread = f"; rounds {low:.2f}-{high:.2f}" if f"{low:.2f}" != f"{high:.2f}" else ""
    return f"{row.passes} ({row.tau:.2f}{spread})"


def plot(result: Sweep, batches: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = [method for method in dict.fromkeys(r.method for r in result.rows) if method != "plain"]
    for index, method in enumerate(methods):
        xs = [b for b in batches if result.speedup(method, b) is not None]
        ys = [result.speedup(method, b) for b in xs]
        (line,) = ax.plot(xs, ys, marker="o", label=method, linestyle=line_style(index))
        cross = result.crossover(method, xs)
        if cross is not None:
            ax.plot([cross], [result.speedup(method, cross)], marker="x", markersize=12, color=line.get_color())
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size B (concurrent requests)")
    ax.set_ylabel("tokens/s relative to plain batched decoding")
    ax.set_title(f"speedup by load ({result.threads} thread(s), x = crossover)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
    if args.plot:
        plot(result, batches, args.plot)
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(result)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
