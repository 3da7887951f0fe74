"""Skip-set search: which sub-layers to skip so that self-speculation runs fastest.

``score="theory"`` (the default): from a calibration pass over each prompt's greedy continuation, alpha_d(r) =
sum_x min(p, q) for every root r and depth d <= ``depth`` (q computed as ``propose`` does, one batched pass per
residue class mod ``depth``); c(S) and the verify cost t(g + 1) / t(1) from timed sub-layers; score = max over gamma of
``sf.theory.expected_speedup(alpha(gamma), gamma, c, verify_cost(gamma))``. Under greedy the exact tau of
constant-gamma decoding on the calibration text is reported too. ``score="measured"`` times real generations.

The search is a beam search over sub-layers (``beam=1``: greedy forward selection), stopping after ``patience``
rounds without a better score.

Command: ``python -m specfamily.drafters.self_spec.search --model PATH_OR_ZOO --out FILE.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from specfamily.core.costs import process_clock
from specfamily.core.loop import generate
from specfamily.core.sampling import warp
from specfamily.core.target import Target, load_target
from specfamily.core.theory import expected_speedup
from specfamily.core.types import SamplingConfig
from specfamily.drafters.self_spec.calibration import Calibration, CostModel, calibrate, measure_costs, sync_for
from specfamily.drafters.self_spec.config import SkipSetRecord, model_key, save_skip_set
from specfamily.drafters.self_spec.layers import (
    LayerRunner,
    Step,
    SubLayer,
    all_sublayers,
    draft_entries_discarded,
    format_skip,
)
from specfamily.zoo import prompt_ids

NAN = float("nan")
STRATEGIES = ("beam", "ranked")


@dataclass
class SearchOptions:
    prompts: int = 8  # calibration prompts
    prompt_set: str = "complete"  # zoo held-out prompt set the prompts come from
    max_new_tokens: int = 64  # continuation length per prompt
    max_prompt_tokens: int = 512  # prompts are cut to their last this many tokens
    depth: int = 6  # largest gamma considered
    beam: int = 2
    patience: int = 1  # rounds without improvement before stopping
    max_skip: int | None = None  # most sub-layers skipped (None: no limit)
    min_skip: int = 0  # fewest sub-layers the chosen set skips (1: a set even when skipping nothing scores best)
    score: str = "theory"  # theory | measured
    strategy: str = "beam"  # beam: grow sets one sub-layer a round | ranked: nested sets in single-skip order
    gamma: int = 4  # draft length of score="measured"
    temperature: float = 0.0  # sampling the scores assume (the continuation is greedy either way)
    repeats: int = 15  # timing repetitions (medians)
    validate: bool = True  # time the chosen set against plain decoding and record it

    def __post_init__(self) -> None:
        for name in ("prompts", "max_new_tokens", "max_prompt_tokens", "depth", "beam", "gamma", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.score not in ("theory", "measured"):
            raise ValueError(f"score must be 'theory' or 'measured', got {self.score!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature)


@dataclass(frozen=True)
class Candidate:
    skipped: frozenset[SubLayer]
    speedup: float  # the score
    gamma: int
    alpha: float
    c: float
    verify_cost: float
    tau: float = NAN  # exact constant-gamma tau on the calibration text (greedy only)


# ---------------------------------------------------------------- alpha by depth


def band_mask(prefix: int, start: int, depth: int, count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, count, prefix + count) additive mask of chains of ``depth`` tokens rooted every ``depth`` positions.

    Fed token j (absolute position start + j) belongs to the chain rooted at j0 = j - j % depth: it sees the
    committed prefix before its root (the first ``start + j0`` cached positions) and its chain's tokens j0 .. j.
    """
    j = torch.arange(count, device=device)
    j0 = j - j % depth
    full = torch.arange(prefix, device=device)[None, :] < (start + j0)[:, None]
    chain = (j[None, :] >= j0[:, None]) & (j[None, :] <= j[:, None])
    visible = torch.cat((full, chain), dim=1)
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(visible, zero, torch.finfo(dtype).min).view(1, 1, count, prefix + count)


@torch.inference_mode()
def band_logits(runner: LayerRunner, calibration: Calibration, plan: tuple[Step, ...], depth: int,
                phase: int) -> torch.Tensor:
    """(count, V) draft logits at positions P - 1 + phase .. T - 2 for chains of ``depth`` tokens.

    Row j is what ``propose`` computes for the (j % depth + 1)-th draft token of the chain rooted j - j % depth rows
    earlier, when that chain follows the calibration text.
    """
    ids = calibration.ids
    prefix = ids.numel() - 1
    start = calibration.prompt_len - 1 + phase
    count = prefix - start
    mask = band_mask(prefix, start, depth, count, runner.dtype, ids.device)
    positions = torch.arange(start, prefix, device=ids.device).view(1, -1)
    with draft_entries_discarded(calibration.cache, prefix) as cache:
        return runner.logits(runner.hidden(ids[start:prefix].view(1, -1), positions, mask, cache, plan))[0]


def acceptance_by_depth(runner: LayerRunner, calibration: Calibration, plan: tuple[Step, ...], depth: int,
                        sampling: SamplingConfig) -> torch.Tensor:
    """(depth, n) float64: [d - 1, r] = acceptance of the depth-d draft token of the chain rooted at P - 1 + r.

    Under greedy 1 or 0 (the draft's argmax is the target's token); else sum_x min(p, q). nan where the chain
    would run past the calibration text.
    """
    n = calibration.ids.numel() - calibration.prompt_len
    out = torch.full((depth, n), NAN, dtype=torch.float64)
    for phase in range(min(depth, n)):
        logits = band_logits(runner, calibration, plan, depth, phase)  # (n - phase, V)
        rows = slice(phase, n)  # the fed positions among P - 1 .. T - 2
        if sampling.greedy:
            alpha = logits.argmax(-1) == calibration.top[rows]
        else:
            alpha = torch.minimum(calibration.p[rows], warp(logits, sampling)).sum(-1)
        j = torch.arange(n - phase)
        out[j % depth, phase + j - j % depth] = alpha.double().cpu()
    return out


def greedy_tau(accepted: torch.Tensor, gamma: int) -> float:
    """Exact tokens per target pass of constant-gamma greedy decoding, from 0/1 ``accepted`` (depth, n) by root."""
    n = accepted.shape[1]
    root, tokens, passes = 0, 0, 0
    while root < n:
        run = 0
        while run < min(gamma, n - root) and accepted[run, root] == 1:
            run += 1
        tokens += min(run + 1, n - root)
        passes += 1
        root += run + 1
    return tokens / passes


def theory_score(skipped: frozenset[SubLayer], alphas: list[torch.Tensor], costs: CostModel, depth: int,
                 greedy: bool) -> Candidate:
    """The best gamma's ``expected_speedup`` from alpha by depth and the cost model."""
    c = costs.c(skipped)
    best = None
    for gamma in range(1, depth + 1):
        values = torch.cat([a[:gamma].reshape(-1) for a in alphas])
        alpha = float(values[~values.isnan()].mean())
        verify_cost = costs.verify_cost[gamma]
        speedup = expected_speedup(min(max(alpha, 0.0), 1.0), gamma, c, verify_cost)
        if best is None or speedup > best.speedup:
            best = Candidate(skipped, speedup, gamma, alpha, c, verify_cost)
    if greedy:
        tau = sum(greedy_tau(a, best.gamma) * a.shape[1] for a in alphas) / sum(a.shape[1] for a in alphas)
        best = replace(best, tau=tau)
    return best


# ---------------------------------------------------------------- the search


def beam_search(score: Callable[[frozenset[SubLayer]], Candidate], sublayers: Sequence[SubLayer], beam: int = 2,
                patience: int = 1, max_skip: int | None = None) -> tuple[Candidate, list[Candidate]]:
    """Grow skip sets one sub-layer at a time, keep the ``beam`` best; (best, every candidate scored)."""
    scored: dict[frozenset[SubLayer], Candidate] = {}

    def evaluate(skipped: frozenset[SubLayer]) -> Candidate:
        if skipped not in scored:
            scored[skipped] = score(skipped)
        return scored[skipped]

    best = evaluate(frozenset())
    frontier, stale = [frozenset()], 0
    limit = len(sublayers) if max_skip is None else min(max_skip, len(sublayers))
    for _ in range(limit):
        grown = {s | {k} for s in frontier for k in sublayers if k not in s}
        ranked = sorted((evaluate(s) for s in grown), key=lambda c: (-c.speedup, format_skip(c.skipped)))
        if not ranked:
            break
        frontier = [c.skipped for c in ranked[:beam]]
        if ranked[0].speedup > best.speedup:
            best, stale = ranked[0], 0
        else:
            stale += 1
            if stale > patience:
                break
    return best, list(scored.values())


def ranked_search(score: Callable[[frozenset[SubLayer]], Candidate], sublayers: Sequence[SubLayer],
                  max_skip: int | None = None, stride: int = 2) -> tuple[Candidate, list[Candidate]]:
    """Score every single skip, rank the sub-layers by it, then score nested sets of the ``k`` best-ranked.

    On a deep model one skipped sub-layer saves too little to beat skipping nothing, so a greedy search stalls
    at the start; the ranked prefixes (k = stride, 2 stride, ...) cost one score each: len + len / stride in all.
    """
    empty = score(frozenset())
    singles = [score(frozenset({k})) for k in sublayers]
    order = sorted(singles, key=lambda c: (-c.speedup, format_skip(c.skipped)))
    ranked = [next(iter(c.skipped)) for c in order]
    limit = len(ranked) if max_skip is None else min(max_skip, len(ranked))
    nested = [score(frozenset(ranked[:k])) for k in range(stride, limit + 1, stride)]
    history = [empty, *singles, *nested]
    return max(history, key=lambda c: (c.speedup, -len(c.skipped))), history


def _prompts(target: Target, options: SearchOptions) -> list[list[int]]:
    """``options.prompts`` prompts spread over the zoo prompt set, cut to their last ``max_prompt_tokens``."""
    return prompt_ids(options.prompt_set, options.prompts, target.tokenizer, last=options.max_prompt_tokens)


def search_skip_set(
    target: Target,
    options: SearchOptions | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
    costs: CostModel | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[Candidate, list[Candidate], CostModel]:
    """Search the skip set of ``target``: (best, all scored candidates, the cost model used)."""
    options = options or SearchOptions()
    log = log or (lambda message: None)
    runner = LayerRunner(target.model)
    prompts = _prompts(target, options) if prompts is None else prompts
    sampling = options.sampling
    calibrations = calibrate(target, prompts, options.max_new_tokens, sampling)
    log(f"calibrated on {len(calibrations)} prompts")
    if costs is None:
        costs = measure_costs(target, runner, calibrations[0].ids, options.depth, options.repeats)
        log(f"t(1) {costs.t1 * 1e3:.2f} ms; draft step: fixed {costs.fixed * 1e3:.2f} ms, attention "
            f"{costs.attn * 1e3:.2f} ms, MLP {costs.mlp * 1e3:.2f} ms (c without skipping {costs.c(frozenset()):.3f}); "
            f"verify cost t(g + 1) / t(1) {[round(v, 2) for v in costs.verify_cost[1:]]}")
    sublayers = all_sublayers(runner.num_layers)

    def score(skipped: frozenset[SubLayer]) -> Candidate:
        if options.score == "measured":
            speedup, tau, alpha, c, _ = run_drafted(target, skipped, prompts, options.gamma, options.max_new_tokens,
                                                    options.sampling)
            candidate = Candidate(frozenset(skipped), speedup, options.gamma, alpha, c, NAN, tau)
        else:
            plan = runner.plan(skipped)
            alphas = [acceptance_by_depth(runner, cal, plan, options.depth, sampling) for cal in calibrations]
            candidate = theory_score(skipped, alphas, costs, options.depth, sampling.greedy)
        log(f"{format_skip(skipped) or '[]'}: speedup {candidate.speedup:.3f} gamma {candidate.gamma} "
            f"alpha {candidate.alpha:.3f} c {candidate.c:.3f}")
        return candidate

    if options.strategy == "ranked":
        best, history = ranked_search(score, sublayers, options.max_skip)
    else:
        best, history = beam_search(score, sublayers, options.beam, options.patience, options.max_skip)
    if len(best.skipped) < options.min_skip:
        allowed = [c for c in history if len(c.skipped) >= options.min_skip]
        if not allowed:
            raise ValueError(f"no scored skip set skips at least {options.min_skip} sub-layers")
        best = max(allowed, key=lambda c: (c.speedup, -len(c.skipped)))
        log(f"skipping nothing scores best; the best set skipping >= {options.min_skip}: {format_skip(best.skipped)}")
    return best, history, costs


def run_drafted(target: Target, skipped, prompts, gamma: int, max_new_tokens: int, sampling: SamplingConfig):
    """(speedup over plain decoding, tau, alpha, c, outputs identical) on ``prompts``, plain and drafted interleaved.

    Times are taken with ``process_clock`` (CPU time on a one-thread CPU), after one warm-up generation each.
    """
    from specfamily.drafters.self_spec.drafter import SelfSpecDrafter

    drafter = SelfSpecDrafter(target, skip=format_skip(skipped), gamma=gamma)
    clock, sync = process_clock(target.device), sync_for(target.device)
    seconds = {None: 0.0, drafter: 0.0}
    spec, identical = [], True
    for d in seconds:
        generate(target, d, list(prompts[0]), max_new_tokens, sampling)
    for prompt in prompts:
        results = []
        for d in seconds:
            sync()
            start = clock()
            results.append(generate(target, d, list(prompt), max_new_tokens, sampling))
            sync()
            seconds[d] += clock() - start
        spec.append(results[1])
        identical = identical and results[0].tokens == results[1].tokens
    tau = sum(r.metrics.new_tokens for r in spec) / sum(r.metrics.target_passes for r in spec)
    alphas = [r.metrics.acceptance_rate for r in spec if not math.isnan(r.metrics.acceptance_rate)]
    cs = [r.metrics.c for r in spec if not math.isnan(r.metrics.c)]
    alpha, c = (statistics.fmean(alphas) if alphas else NAN), (statistics.fmean(cs) if cs else NAN)
    return seconds[None] / seconds[drafter], tau, alpha, c, identical


# ---------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specfamily.drafters.self_spec.search", description=__doc__.split(
        "\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", required=True, help="the target: a folder, a hub name or a zoo: name")
    parser.add_argument("--out", required=True, help="skip-set JSON to write (atomically)")
    parser.add_argument("--name", default=None, help="model name recorded in the file (default: --model)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the timings")
    defaults = SearchOptions()
    for key in ("prompts", "max_new_tokens", "max_prompt_tokens", "depth", "beam", "patience", "max_skip",
                "min_skip", "gamma", "repeats"):
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=getattr(defaults, key))
    parser.add_argument("--prompt-set", default=defaults.prompt_set)
    parser.add_argument("--score", choices=("theory", "measured"), default=defaults.score)
    parser.add_argument("--strategy", choices=STRATEGIES, default=defaults.strategy)
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--no-validate", dest="validate", action="store_false")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    options = SearchOptions(**{key: getattr(args, key) for key in SearchOptions.__dataclass_fields__})
    target = load_target(args.model, device=args.device)
    prompts = _prompts(target, options)
    started = time.perf_counter()
    best, history, _ = search_skip_set(target, options, prompts, log=lambda message: print(message, flush=True))
    print(f"searched {len(history)} skip sets in {time.perf_counter() - started:.0f} s")
    measured = None  # with --validate, a real timed run against plain decoding
    if options.validate:
        speedup, tau, alpha, c, identical = run_drafted(target, best.skipped, prompts, best.gamma,
                                                        options.max_new_tokens, options.sampling)
        measured = {"speedup": speedup, "tau": tau, "alpha": alpha, "c": c, "identical_to_plain": identical}
    search = {key: getattr(options, key) for key in SearchOptions.__dataclass_fields__}
    search.update(simulated_tau=best.tau, threads=torch.get_num_threads(), device=str(target.device))
    record = SkipSetRecord(model_key(target.model, args.name or args.model), format_skip(best.skipped), best.gamma,
                           best.alpha, best.c, best.verify_cost, best.speedup, measured, search)
    save_skip_set(args.out, record)
    print(f"best {record.skip}: predicted speedup {best.speedup:.3f} at gamma {best.gamma}; measured "
          f"{record.measured}; written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
