"""Calibration of the skip-set search: the target's greedy continuations with its cache and p along them, and
the cost model (target passes over 1 .. depth + 1 tokens, draft steps with sub-layers kept or skipped), timed
with interleaved medians on the process clock of ``specfamily.core.costs``."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specfamily.core.costs import process_clock
from specfamily.core.loop import generate
from specfamily.core.sampling import warp
from specfamily.core.target import Target
from specfamily.core.types import Draft, SamplingConfig
from specfamily.drafters.self_spec.layers import LayerRunner, Step, SubLayer, draft_entries_discarded


@dataclass
class Calibration:
    """One prompt: ids = prompt + the target's continuation; the target's cache and p along it."""

    ids: torch.Tensor  # (T,)
    prompt_len: int  # P; roots are the positions P - 1 .. T - 2
    cache: object  # the target's DynamicCache over ids[:T - 1]
    p: torch.Tensor  # (n, V) warped target distributions at positions P - 1 .. T - 2
    top: torch.Tensor  # (n,) the target's argmax there


@dataclass
class CostModel:
    """Seconds of one target pass over 1 token, the verify-cost curve and the draft step's costs.

    Sub-layers of one kind have the same shape in every layer, so a draft step costs
    ``fixed + kept attention sub-layers * attn + kept MLPs * mlp``.
    """

    t1: float
    verify_cost: list[float]  # [g] = t(g + 1) / t(1), g = 0 .. depth
    fixed: float  # draft step with every sub-layer skipped (embedding, final norm, head, argmax)
    attn: float  # seconds one kept attention sub-layer adds
    mlp: float  # seconds one kept MLP adds
    num_layers: int

    def c(self, skipped: frozenset[SubLayer]) -> float:
        kept_attn = self.num_layers - sum(kind == "attn" for kind, _ in skipped)
        kept_mlp = self.num_layers - sum(kind == "mlp" for kind, _ in skipped)
        return (self.fixed + kept_attn * self.attn + kept_mlp * self.mlp) / self.t1


@torch.inference_mode()
def calibrate(target: Target, prompts: Sequence[Sequence[int]], max_new_tokens: int,
              sampling: SamplingConfig) -> list[Calibration]:
    """Greedy continuations, then one target pass over each (prompt + continuation) keeping its cache and p."""
    calibrations = []
    for prompt in prompts:
        continuation = generate(target, None, list(prompt), max_new_tokens=max_new_tokens).tokens
        if len(continuation) < 2:
            continue
        prompt_ids = target.check_ids(list(prompt))
        target.reset()
        out = target.forward(prompt_ids, Draft.chain(continuation[:-1]))
        target.commit(list(range(len(continuation) - 1)))
        cache = target.cache
        target.reset()
        ids = torch.cat((prompt_ids, torch.tensor(continuation, device=prompt_ids.device)))
        calibrations.append(Calibration(ids, len(prompt), cache, warp(out.logits, sampling), out.logits.argmax(-1)))
    if not calibrations:
        raise ValueError("no calibration prompt gave a continuation of 2 tokens or more")
    return calibrations


def sync_for(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _clock(fns: Sequence[Callable[[], object]], repeats: int, device: torch.device) -> list[float]:
    """Median seconds of each ``fn()`` over ``repeats`` interleaved rounds, after one warm-up round."""
    clock, sync = process_clock(device), sync_for(device)
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(repeats + 1):
        for fn, samples in zip(fns, times, strict=True):
            sync()
            start = clock()
            fn()
            sync()
            if round_:
                samples.append(clock() - start)
    return [statistics.median(samples) for samples in times]


@torch.inference_mode()
def measure_costs(target: Target, runner: LayerRunner, context: torch.Tensor, depth: int,
                  repeats: int) -> CostModel:
    """Time target passes over 1 .. depth + 1 tokens and draft steps with all, no attention, no MLP, nothing kept."""
    device = target.device
    target.reset()
    target.forward(context[:-1])
    target.commit([])
    root = context[-1:]
    position = torch.tensor([[target.cached_length]], device=device)

    def verify(g: int) -> Callable[[], object]:
        draft = Draft.chain(context[:g].cpu()) if g else None
        return lambda: (target.forward(root, draft), target.commit([]))

    def step(plan: tuple[Step, ...]) -> Callable[[], object]:
        def run():  # at the committed length, which the timed verify passes grow
            with draft_entries_discarded(target.cache, target.cached_length) as cache:
                return runner.logits(runner.hidden(root.view(1, 1), position, None, cache, plan)[:, -1]).argmax()

        return run

    full = runner.plan(frozenset())
    plans = (full, tuple(s for s in full if not s.is_attn), tuple(s for s in full if s.is_attn), ())
    times = _clock([verify(g) for g in range(depth + 1)] + [step(plan) for plan in plans], repeats, device)
    t, (t_full, t_mlps, t_attns, t_fixed) = times[: depth + 1], times[depth + 1 :]
    target.reset()
    layers = runner.num_layers
    attn, mlp = max(t_full - t_mlps, 0.0) / layers, max(t_full - t_attns, 0.0) / layers
    return CostModel(t[0], [x / t[0] for x in t], t_fixed, attn, mlp, layers)
