"""Power at depth by construction: when a drafter's drafts seldom get deep on the kit's tiny target, the kit sharpens
the target toward the drafter's own proposals until they do.

A lossless system follows whatever p the target has, so the kit may choose the target from pilot data alone: it
fine-tunes a copy of the tiny target to predict the tokens along each piloted draft's first path, depths 1 to
``min_depth - 1`` (the node at ``min_depth`` is left alone), rebuilds the drafter on the copy with the author's
factory and pilots again on fresh seeds, for at most ``ROUNDS`` rounds. Where no round gets there, the run is sized
on the drafter's own target and the verdict says the depth was not tested.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from specfamily.core.target import load_target
from specfamily.core.types import Draft, SamplingConfig
from specfamily.testing.setting import KitSetting
from specfamily.testing.sizing import PILOT_SAMPLES, PILOT_SEED, Budget, Pilot, pilot

ROUNDS = 2  # sharpening rounds at most, each followed by a pilot on fresh seeds (and stopped when one gains nothing)
STEPS = 40  # Adam steps per round, full batch over every drafted path recorded so far
LEARNING_RATE = 0.03
SMOOTHING = 0.3  # label smoothing of the fine-tuning: the drafted token gets about 0.74 of p (V = 8), never 1


@dataclass
class Plan:
    """The target, drafter and sample count a run uses, and how they were chosen."""

    target: object
    drafter: object
    setting: KitSetting
    samples: int
    budget: Budget  # its tests' level (with the number of looks) and powers
    note: str = ""  # how the kit chose the target ("": the setting's own)


def plan_run(factory: Callable, setting: KitSetting, sampling: SamplingConfig, budget: Budget,
             samples: int | None) -> Plan:
    """Build the target and drafter and size the run: ``samples`` when given, else from pilots (sharpening the
    target when the drafter's own pilot falls short of the depth budget)."""
    target = setting.target()
    drafter = factory(target)
    if samples is not None:
        return Plan(target, drafter, setting, samples, budget)
    if drafter is None or budget.min_depth == 0:
        return Plan(target, drafter, setting, budget.base_samples, budget)
    measured, drafts = _pilot(target, drafter, setting, sampling, budget, 0)
    sized = budget.sized(measured.rate)
    if sized is not None:
        return Plan(target, drafter, setting, sized[1], sized[0])
    note = (f"{measured.describe(budget.min_depth)} ({budget.level_tokens} such tokens are needed within "
            f"{budget.max_samples} samples)")
    fallback = Plan(target, drafter, setting, budget.base_samples, budget, note)
    return _sharpen(factory, setting, sampling, fallback, measured, drafts)


def _pilot(target, drafter, setting: KitSetting, sampling: SamplingConfig, budget: Budget,
           round_: int) -> tuple[Pilot, list[tuple[list[int], Draft]]]:
    """Pilot ``round_`` (its own block of seeds) and the drafts it recorded."""
    first = PILOT_SEED + round_ * PILOT_SAMPLES
    return pilot(target, drafter, setting, sampling, budget.min_depth, first_seed=first, keep_drafts=True)


def _sharpen(factory: Callable, setting: KitSetting, sampling: SamplingConfig, fallback: Plan, measured: Pilot,
             drafts: list) -> Plan:
    """Sharpen the target round by round; the first round whose pilot reaches the budget is the plan."""
    budget = fallback.budget
    model, rows, history = fallback.target.model, [], [measured.mean]
    for round_ in range(1, ROUNDS + 1):
        rows += path_rows(drafts, budget.min_depth - 1)
        if not rows:
            break
        model = sharpened(model, rows, seed=round_, temperature=sampling.temperature or 1.0)
        target = load_target(model)
        drafter = factory(target)
        measured, drafts = _pilot(target, drafter, setting, sampling, budget, round_)
        gained = measured.mean > history[-1]
        history.append(measured.mean)
        sized = budget.sized(measured.rate)
        if sized is not None:
            trail = " -> ".join(f"{mean:.2f}" for mean in history)
            note = (f"target sharpened toward the drafter's proposals in {round_} round(s) of {STEPS} Adam steps on "
                    f"{len(rows)} drafted paths from pilot seeds (level-{budget.min_depth} tokens per sample "
                    f"{trail})")
            return Plan(target, drafter, replace(setting, sharpened=round_), sized[1], sized[0], note)
        if not gained:
            break
    trail = " -> ".join(f"{mean:.2f}" for mean in history)
    fallback.note += f"; sharpening the target toward its proposals did not get there (tokens per sample {trail})"
    return fallback


def first_path(draft: Draft) -> list[int]:
    """The tokens along a draft's first child at every level, from the root down."""
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    path, node = [], -1
    while True:
        child = next((i for i, parent in enumerate(parents) if parent == node), None)
        if child is None:
            return path
        path.append(tokens[child])
        node = child


def path_rows(drafts: list[tuple[list[int], Draft]], depth: int) -> list[tuple[list[int], int]]:
    """(context + the first path's first ``depth`` tokens, context length) for every draft with such a path."""
    rows = []
    for context, draft in drafts:
        path = first_path(draft)[:depth]
        if path:
            rows.append((context + path, len(context)))
    return rows


def sharpened(model, rows: list[tuple[list[int], int]], seed: int, temperature: float = 1.0, steps: int = STEPS,
              learning_rate: float = LEARNING_RATE):
    """A copy of ``model`` fine-tuned (full-batch Adam) to give each row's tokens after its context length the
    probability ``1 - SMOOTHING`` (plus its share of the rest) at ``temperature``: likely, never certain, so the
    decisions the tests look at stay random under every warp."""
    model = copy.deepcopy(model)
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    rows_at, positions, labels = [], [], []
    for row, (tokens, context) in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        for position in range(context, len(tokens)):  # the logits at position - 1 predict tokens[position]
            rows_at.append(row)
            positions.append(position - 1)
            labels.append(tokens[position])
    rows_at, positions, labels = torch.tensor(rows_at), torch.tensor(positions), torch.tensor(labels)
    torch.manual_seed(seed)
    with torch.inference_mode(False), torch.enable_grad():
        parameters = [p for p in model.parameters() if p.is_floating_point()]
        for parameter in parameters:
            parameter.requires_grad_(True)
        optimiser = torch.optim.Adam(parameters, lr=learning_rate)
        for _ in range(steps):
            optimiser.zero_grad()
            logits = model(input_ids=ids, attention_mask=mask).logits[rows_at, positions] / temperature
            torch.nn.functional.cross_entropy(logits, labels, label_smoothing=SMOOTHING).backward()
            optimiser.step()
        for parameter in parameters:
            parameter.requires_grad_(False)
    return model.eval()
