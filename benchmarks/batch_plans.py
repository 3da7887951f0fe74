"""The batched draft-length plans, judged apart from the machine's load: passes, rows fed and tau of each arm, and its
time priced on one idle cost table t(B, N).

The workload is ``batch_sweep.py``'s (Spec-Bench first turns, ``--requests-per-slot`` R: R B requests at max_batch B).
Each arm decodes it greedily through ``sf.generate_batch`` on a priced clock: every batched pass costs t(B, N) from the
table (B slots feeding N rows; a newcomer's prompt adds its own prefill's t(P) - t(1, 1)), and nothing else advances
it, so the length policy plans and learns on the table's costs and its choices are the same on a loaded machine as on
an idle one (deterministic for these prompts). The table is measured once here (one thread, CPU clock, medians of
``--table-repeats``: ``BatchTarget.forward`` over B caches holding the first prompt, N - B draft rows spread as chains
over the slots) or read from ``--table`` (JSON, as ``--save-table`` writes it). With ``--far-context`` C the table
is measured again with every slot holding C tokens (the prompts run together), and each pass is priced at its own
slots' contexts, linearly between the two: a cost per slot per cached token (from the plain passes) and one per draft
row per cached token of its slot (from the drafted ones), as the batch's own ``RowCosts`` prices it. A drafter's
proposal time is not priced (prompt lookup and suffix propose in microseconds; a model drafter would need its
step priced too).

Arms: ``plain``, each drafter at its defaults (draft length by load; run twice on the same target, the second, warm
run kept, as a sweep's repeats or a server keep the learned costs and realized windows), and with ``--gammas`` each
drafter at those constant draft lengths. Per arm and B: batched passes, the rows the steady passes fed, the target
passes over the requests (the sweep's count) and tau, the priced seconds and the speedup over plain. B = 1 is
``sf.generate`` (batch 1's own policy), which the table does not price: left out.

    python benchmarks/batch_plans.py --batch-sizes 2,4 --drafters prompt_lookup,suffix --per-category 1 \
        --requests-per-slot 2 --max-prompt-tokens 0 --max-new-tokens 128 --gammas 1,2,3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from common import make_clock, quiet_transformers, set_threads, spec_bench_prompts

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.arrivals import LoopClock
from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.target import TargetOutput
from specfamily.core.types import Draft

DEPTH = 16  # the lookup drafters' deepest level


@dataclass
class Priced:
    """An idle cost table: t(B, N) at measured N per B (linear between) with every slot holding ``near`` cached
    tokens, the same at ``far`` tokens where measured, and one prompt's prefill t(P). Between and past the two
    contexts a pass is priced linearly in its slots' cached tokens and its draft rows' (``t``)."""

    passes: dict[int, dict[int, float]]  # B -> {N: seconds}, every slot at ``near`` cached tokens
    prefill: dict[int, float]  # P -> seconds of one slot's prefill of P tokens
    near: int = 0
    far: int = 0
    far_passes: dict[int, dict[int, float]] | None = None  # B -> {N: seconds}, every slot at ``far`` cached tokens

    def t(self, batch: int, rows: int, slots: float | None = None, drafted: float = 0.0) -> float:
        """t(B, N) at ``near`` (``slots`` None or no far table), else priced at the pass's contexts: ``slots``
        cached tokens over its B slots and ``drafted`` over its N - B draft rows (each its slot's cached tokens)."""
        near_points = sorted(self.passes[batch].items())
        near = _linear(near_points, rows)
        if slots is None or not self.far_passes or self.far <= self.near:
            return near
        span, far_points = self.far - self.near, sorted(self.far_passes[batch].items())
        plain = _linear(far_points, batch) - _linear(near_points, batch)
        grown = _linear(far_points, rows) - near
        k_slot = plain / (batch * span)
        k_row = (grown - plain) / ((rows - batch) * span) if rows > batch else 0.0
        return near + k_slot * (slots - batch * self.near) + k_row * (drafted - (rows - batch) * self.near)

    def prefill_extra(self, tokens: int) -> float:
        return max(0.0, _linear(sorted(self.prefill.items()), tokens) - self.t(1, 1))

    def to_json(self) -> dict:
        return {"passes": _keyed(self.passes, str), "prefill": {str(p): s for p, s in self.prefill.items()},
                "near": self.near, "far": self.far, "far_passes": _keyed(self.far_passes or {}, str)}

    @classmethod
    def from_json(cls, data: dict) -> Priced:
        return cls(_keyed(data["passes"], int), {int(p): s for p, s in data["prefill"].items()}, data.get("near", 0),
                   data.get("far", 0), _keyed(data.get("far_passes", {}), int) or None)


def _keyed(table: dict, key) -> dict:
    """A {B: {N: seconds}} table with both levels' keys made ``key`` (str for JSON, int back)."""
    return {key(b): {key(n): s for n, s in v.items()} for b, v in table.items()}


def _linear(points: list[tuple[int, float]], x: float) -> float:
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def measure_table(target, prompts: list[list[int]], batches: list[int], repeats: int, clock, far: int = 0) -> Priced:
    """t(B, N) for B = 1 .. max(batches), N = B .. B (1 + DEPTH) (every N to B + 16, then every 4th), with every
    slot holding the first prompt, and again holding ``far`` tokens (the prompts run together; 0: not measured);
    each distinct prompt length's prefill of one slot; medians of ``repeats`` on ``clock``."""
    prompt = prompts[0]
    passes = _passes(target, prompt, batches, repeats, clock)
    long = [t for p in prompts for t in p][:far] if far > len(prompt) else []
    far_passes = _passes(target, long, batches, repeats, clock) if len(long) == far and far else None
    prefill = {}
    for length in sorted({len(p) for p in prompts}):
        chosen = next(p for p in prompts if len(p) == length)
        engine = BatchTarget(target, 1, length + 8)
        times = []
        for _ in range(repeats):
            engine.reset_slot(0)
            start = clock()
            engine.forward(0, [SlotFeed(torch.tensor(chosen), Draft.empty())])
            times.append(clock() - start)
            engine.commit(0, [])
        prefill[length] = statistics.median(times)
    return Priced(passes, prefill, len(prompt), far if far_passes else 0, far_passes)


def _passes(target, prompt: list[int], batches: list[int], repeats: int, clock) -> dict[int, dict[int, float]]:
    passes: dict[int, dict[int, float]] = {}
    for batch in range(1, max(batches) + 1):
        engine = BatchTarget(target, batch, len(prompt) + 64)
        engine.forward(0, [SlotFeed(torch.tensor(prompt), Draft.empty())] * batch)
        for slot in range(batch):
            engine.commit(slot, [])
        extra = sorted({*range(0, 17), *range(16, batch * DEPTH + 1, 4), batch * DEPTH})
        passes[batch] = {batch + e: _timed(engine, prompt, batch, e, repeats, clock) for e in extra}
    return passes


def _timed(engine: BatchTarget, prompt: list[int], batch: int, extra: int, repeats: int, clock) -> float:
    per = [extra // batch + (slot < extra % batch) for slot in range(batch)]
    feeds = [SlotFeed(torch.tensor([prompt[-1]]), Draft.chain(prompt[:k]) if k else Draft.empty()) for k in per]
    times = []
    for _ in range(repeats + 1):
        start = clock()
        engine.forward(0, feeds)
        times.append(clock() - start)
        for slot in range(batch):
            engine.commit(slot, [])
        engine.cache.lengths[:] = [len(prompt)] * batch
    return statistics.median(times[1:])


@dataclass
class Arm:
    method: str
    batch: int
    seconds: float  # priced
    batch_passes: int
    steady_passes: int
    steady_rows: int  # rows the steady passes fed (roots and drafts)
    target_passes: int  # over the requests (batch_sweep's count)
    tokens: int
    mismatched: int = 0
    host: float = 0.0  # CPU seconds of the run outside the model (oracle runs: all of it), one thread

    @property
    def tau(self) -> float:
        return self.tokens / self.target_passes


class Oracle:
    """Each request's greedy text (prompt + new tokens, from one plain run): a pass's logits without the model.
    Under greedy decoding a row's argmax is the text's next token after the row's path, so a fed row predicts the
    text's token at the context's length plus its depth; verification then accepts exactly what the model would
    (the stream kernel is batch-invariant: the batched texts equal batch 1's). Lookup drafters only."""

    def __init__(self, texts: list[list[int]], vocab: int) -> None:
        self.texts, self.vocab, self.live = texts, vocab, []  # texts[i]: request i's prompt and greedy tokens

    def forward(self, engine: BatchTarget, lo: int, feeds, features=False):
        outputs = []
        for b, (feed, request) in enumerate(zip(feeds, self.live, strict=True)):
            text = self.texts[request.index]
            at = len(request.ctx.tokens)
            depths = [0, *feed.draft.depths().tolist()] if len(feed.draft) else [0]
            logits = torch.zeros(len(depths), self.vocab)
            for row, depth in enumerate(depths):
                logits[row, text[at + depth] if at + depth < len(text) else 0] = 1.0
            parents = tuple(feed.draft.parents.tolist())
            engine._last[lo + b] = (engine.cache.lengths[lo + b] + feed.pending.numel(), parents)
            outputs.append(TargetOutput(logits, None))
        engine.rows = sum(f.pending.numel() + len(f.draft) for f in feeds)
        return outputs

    @staticmethod
    def commit(engine: BatchTarget, slot: int, accepted_nodes) -> None:
        base, _ = engine._last.pop(slot)
        engine.cache.lengths[slot] = base + len(accepted_nodes)

    @staticmethod
    def move(engine: BatchTarget, src: int, dst: int) -> None:
        engine.cache.lengths[dst] = engine.cache.lengths[src]


def priced_run(target, drafter, prompts: list[list[int]], batch: int, budget: int, table: Priced,
               oracle: Oracle | None = None) -> tuple:
    """generate_batch on the priced clock (the model replaced by ``oracle`` when given): (results, batched passes,
    steady passes, steady rows, seconds)."""
    state = {"t": 0.0, "passes": 0, "steady": 0, "rows": 0}
    forward, step, commit, move = BatchTarget.forward, batch_loop._Batch._step, BatchTarget.commit, BatchTarget.move

    def priced(self, lo, feeds, features=False):
        prefills = [f.pending.numel() for f in feeds if f.pending.numel() > 1]
        rows = sum(f.pending.numel() + len(f.draft) for f in feeds if f.pending.numel() == 1)
        steady = [(f, c) for f, c in zip(feeds, self.cache.lengths[lo:], strict=False) if f.pending.numel() == 1]
        slots = sum(c for _, c in steady) + table.near * len(prefills)  # a newcomer's root: priced as at near
        drafted = sum(len(f.draft) * c for f, c in steady)
        state["t"] += sum(table.prefill_extra(p) for p in prefills) + \
            table.t(len(feeds), rows + len(prefills), slots, drafted)
        state["passes"] += 1
        if not prefills:
            state["steady"] += 1
            state["rows"] += rows
        return forward(self, lo, feeds, features) if oracle is None else oracle.forward(self, lo, feeds, features)

    def stepped(self):
        if oracle is not None:
            oracle.live = list(self.live)
        return step(self)

    clock = LoopClock(lambda: state["t"], lambda s: state.__setitem__("t", state["t"] + s))
    batch_loop.BatchTarget.forward, batch_loop._Batch._step = priced, stepped
    if oracle is not None:
        BatchTarget.commit, BatchTarget.move = oracle.commit, oracle.move
    try:
        results = sf.generate_batch(target, drafter, prompts, budget, max_batch=batch, clock=clock)
    finally:
        batch_loop.BatchTarget.forward, batch_loop._Batch._step = forward, step
        BatchTarget.commit, BatchTarget.move = commit, move
    return results, state["passes"], state["steady"], state["rows"], state["t"]


def oracle_of(target, prompts: list[list[int]], batch: int, budget: int, path: str) -> Oracle:
    """The prompts' greedy texts: read from ``path`` (JSON) where it has them all, else one plain batched run."""
    known = json.loads(Path(path).read_text()) if path and Path(path).is_file() else []
    texts = {tuple(p): t for p, t in known}
    missing = [p for p in prompts if tuple(p) not in texts]
    if missing:
        results = sf.generate_batch(target, None, missing, budget, max_batch=batch)
        texts.update({tuple(p): p + r.tokens for p, r in zip(missing, results, strict=True)})
        if path:
            Path(path).write_text(json.dumps([[list(p), t] for p, t in texts.items()]))
    return Oracle([texts[tuple(p)] for p in prompts], target.vocab_size)


def arms(target, names: list[str], gammas: list[int], prompts: list[list[int]], batch: int, budget: int,
         table: Priced, oracle: Oracle | None) -> list[Arm]:
    out, plain = [], None
    methods = [("plain", None, 1)] + [(n, None, 2) for n in names] + [(n, g, 1) for n in names for g in gammas]
    for name, gamma, runs in methods:
        for attr in ("batch_pass_costs", "batch_realized"):  # every arm learns from nothing (then warm)
            getattr(target, attr).clear()
        for _ in range(runs):
            start = time.process_time()
            drafter = None if name == "plain" else (
                sf.create_drafter(name, target) if gamma is None else sf.create_drafter(name, target, gamma=gamma))
            results, passes, steady, rows, seconds = priced_run(target, drafter, prompts, batch, budget, table, oracle)
            host = time.process_time() - start
        tokens = [r.tokens for r in results]
        plain = tokens if plain is None else plain
        label = name if gamma is None else f"{name} g={gamma}"
        out.append(Arm(label, batch, seconds, passes, steady, rows, sum(r.metrics.target_passes for r in results),
                       sum(map(len, tokens)), sum(a != b for a, b in zip(tokens, plain, strict=True)), host))
        print(_line(out[-1], out[0]), flush=True)
    return out


def _line(arm: Arm, plain: Arm) -> str:
    return (f"| {arm.batch} | {arm.method} | {arm.batch_passes} | {arm.steady_rows / max(arm.steady_passes, 1):.2f} "
            f"| {arm.target_passes} | {arm.tau:.3f} | {arm.seconds:.2f} | {plain.seconds / arm.seconds:.3f}x "
            f"| {arm.mismatched} | {arm.host:.2f} | {(plain.seconds + plain.host) / (arm.seconds + arm.host):.3f}x |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="zoo:smollm2")
    parser.add_argument("--matmul", default="stream")
    parser.add_argument("--batch-sizes", default="2,4")
    parser.add_argument("--drafters", default="prompt_lookup,suffix")
    parser.add_argument("--gammas", default="", help="constant draft lengths to price beside the defaults")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--max-prompt-tokens", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--table", default="", help="read t(B, N) from this JSON instead of measuring it")
    parser.add_argument("--save-table", default="")
    parser.add_argument("--table-repeats", type=int, default=5)
    parser.add_argument("--far-context", type=int, default=0,
                        help="measure t(B, N) again with every slot at this many cached tokens and price each pass "
                             "at its slots' contexts between the two (0: t(B, N) over the first prompt alone)")
    parser.add_argument("--oracle", default="", help="JSON of the prompts' greedy texts (written if missing)")
    parser.add_argument("--model", action="store_true", help="run the model in every arm, not the oracle")
    parser.add_argument("--log", default="", help="write the batched loop's per-pass debug log to this file")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    set_threads(1)
    quiet_transformers()
    if args.log:
        log = logging.getLogger("specfamily.core.batch_log")
        log.setLevel(logging.DEBUG)
        log.addHandler(logging.FileHandler(args.log, mode="w"))
    target = sf.load_target(args.target, matmul=args.matmul)
    prompts, _ = spec_bench_prompts(args.per_category, target.tokenizer)
    if args.max_prompt_tokens > 0:
        prompts = [p[-args.max_prompt_tokens:] for p in prompts]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    names = [n for n in args.drafters.split(",") if n]
    gammas = [int(g) for g in args.gammas.split(",") if g]
    if args.table:
        table = Priced.from_json(json.loads(Path(args.table).read_text()))
    else:
        table = measure_table(target, prompts[:max(batches) * args.requests_per_slot], batches, args.table_repeats,
                              make_clock("cpu"), args.far_context)
        if args.save_table:
            Path(args.save_table).write_text(json.dumps(table.to_json(), indent=1))
    print("| B | arm | batched passes | rows a steady pass | target passes | tau | priced s | speedup | differ "
          "| host s | speedup with host |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for batch in batches:
        chosen = prompts[:batch * args.requests_per_slot]
        oracle = None if args.model else oracle_of(target, chosen, batch, args.max_new_tokens, args.oracle)
        rows += arms(target, names, gammas, chosen, batch, args.max_new_tokens, table, oracle)
    if args.json:
        Path(args.json).write_text(json.dumps([vars(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
