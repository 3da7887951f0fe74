"""Self-speculative drafting: the target itself with a set of sub-layers skipped (Draft & Verify; SWIFT).

The draft pass shares the target's KV cache: kept attention layers read the committed entries and append their own
for the pending and draft tokens; afterwards every layer gets back its committed tensors
(``draft_entries_discarded``), so the target's forward finds the cache as committed. No second cache is kept.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from specfamily import zoo
from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock
from specfamily.core.drafter import BaseDrafter
from specfamily.core.host import draw
from specfamily.core.sampling import warp
from specfamily.core.target import Target
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.self_spec.batched import propose_self_batch
from specfamily.drafters.self_spec.config import (
    SelfSpecConfig,
    check_record_fits,
    load_skip_set,
    model_key,
    shipped_skip_sets,
)
from specfamily.drafters.self_spec.layers import LayerRunner, SubLayer, causal_mask, draft_entries_discarded, parse_skip

_LIST_STRING = re.compile(r"^\s*(attn|mlp|layer):\d+\s*(,\s*(attn|mlp|layer):\d+\s*)*$")


@dataclass
class ExitThreshold:
    """Draft & Verify's adaptive draft exit: stop when the draft's top-1 probability is below ``threshold``.

    After each verification of a draft that was cut by the threshold, the smoothed acceptance
    ``AR <- beta1 AR + (1 - beta1) accepted / drafted`` steers it: ``threshold + step`` if AR <= target
    else ``threshold - step``, smoothed by ``beta2``. Drafts that ran to full length leave it unchanged.
    """

    initial: float
    target: float
    step: float
    beta1: float
    beta2: float
    threshold: float = 0.0
    acceptance: float = 0.0

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.threshold, self.acceptance = self.initial, 0.0

    def update(self, drafted: int, accepted: int, cut: bool) -> None:
        if drafted <= 0:
            return
        self.acceptance = self.beta1 * self.acceptance + (1.0 - self.beta1) * accepted / drafted
        if not cut:
            return
        moved = self.threshold + (self.step if self.acceptance <= self.target else -self.step)
        self.threshold = self.beta2 * self.threshold + (1.0 - self.beta2) * moved


def resolve_skip(skip: Any, target: Target) -> tuple[frozenset[SubLayer], str, int | None]:
    """A skip option -> (skipped sub-layers, where they came from, the gamma a searched set was chosen at)."""
    num_layers = target.num_layers
    if isinstance(skip, (list, tuple)):
        return parse_skip(skip, num_layers), "explicit list", None
    if isinstance(skip, str) and _LIST_STRING.match(skip):
        return parse_skip(skip.split(","), num_layers), "explicit list", None
    if skip is not None and not isinstance(skip, (str, Path)):
        kind = type(skip).__name__
        raise TypeError(f"skip must be a skip-set file, a zoo: name or a list like ['attn:3'], got {kind}")
    key = model_key(target.model, name="target")
    if skip is None:
        path = zoo.zoo_path(zoo.default_weights("skip_set", target))  # the zoo's skip set for this target
    elif zoo.is_zoo_name(skip):
        path = _named_skip_file(skip)
    else:
        path = Path(skip)
    record = load_skip_set(path)
    if not check_record_fits(record, key, str(path)):
        warnings.warn(
            f"skip set {str(path)!r} was searched on other weights of this architecture ({record.model.name!r}); "
            "it is valid but may accept less",
            stacklevel=3,
        )
    return parse_skip(record.skip, num_layers), str(path), record.gamma


def _named_skip_file(name: str) -> Path:
    """``zoo:<stem>`` of a shipped skip-set file (``zoo:code-target``), or a skip-set entry of the zoo's catalogue."""
    shipped = shipped_skip_sets()
    stem = name[len(zoo.ZOO_PREFIX) :]
    if stem in shipped:
        return shipped[stem]
    try:
        is_skip_set = zoo.entry(name).kind == "skip_set"
    except ValueError:
        is_skip_set = False
    if is_skip_set:
        return zoo.zoo_path(name)
    known = ", ".join(zoo.ZOO_PREFIX + n for n in shipped) or "none"
    raise ValueError(f"no shipped skip set {name!r}; shipped: {known}")


class SelfSpecDrafter(BaseDrafter):
    """Drafts a chain with the target's own layers minus a skip set; samples from its warped q (argmax at t=0).

    A proposal that must first feed m > 1 pending tokens (a request's first, over its prompt) reports that pass as
    ``catch_up_seconds``, as the EAGLE drafters report theirs, so neither the metrics' nor the policy's c counts it
    as a draft step."""

    default_gamma = 4
    batch_shared = ("runner", "plan", "kept", "skipped")  # read-only: the target's layers and which of them it runs

    def __init__(self, target: Target, skip: Any = None, gamma: int | None = None, policy: str | None = None,
                 **options: Any) -> None:
        config = SelfSpecConfig(skip=skip, gamma=gamma, policy=policy, **options)
        self.skipped, self.skip_source, searched_gamma = resolve_skip(skip, target)
        if searched_gamma is not None:
            self.default_gamma = searched_gamma  # a searched set's gamma: where auto starts
        super().__init__(gamma, policy)
        self.runner = LayerRunner(target.model)
        self.plan = self.runner.plan(self.skipped)
        # the same sub-layers for the target's lean forward: (attention kept, MLP kept) per layer
        self.kept = tuple((("attn", i) not in self.skipped, ("mlp", i) not in self.skipped)
                          for i in range(self.runner.num_layers))
        self.exit = (
            ExitThreshold(config.exit_threshold, config.exit_target, config.exit_step, config.exit_beta1,
                          config.exit_beta2)
            if config.adaptive_exit else None
        )
        self._drafted, self._cut = 0, False

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        if self.exit is not None:
            self.exit.reset()

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        target = ctx.target
        device, start = target.device, target.cached_length
        pending = torch.tensor(ctx.tokens[start:], dtype=torch.long, device=device)  # (m,), the root last
        m = pending.numel()
        ids, positions = pending.view(1, -1), torch.arange(start, start + m + gamma - 1, device=device).view(1, -1)
        mask = causal_mask(start, m, self.runner.dtype, device) if m > 1 else None
        step_positions = positions[:, :m]
        tokens, qs, cut = [], [], False
        hidden_of, logits_of = self._passes(target)
        clock, catch_up_seconds = device_clock(device), 0.0
        with draft_entries_discarded(target.cache, start) as cache:
            for step in range(gamma):
                catching_up = step == 0 and m > 1  # the pass over m pending rows (the prompt): catch-up, not c
                begun = clock() if catching_up else 0.0
                hidden = hidden_of(ids, step_positions, mask, cache)
                if catching_up:
                    catch_up_seconds = clock() - begun
                token, q, confidence = self._draw(logits_of(hidden[:, -1])[0], ctx)  # from (V,) logits
                tokens.append(token)
                if q is not None:
                    qs.append(q)
                if confidence is not None and step < gamma - 1 and float(confidence) < self.exit.threshold:
                    cut = True
                    break
                ids, mask = token.view(1, 1), None
                step_positions = positions[:, m + step : m + step + 1]
        self._drafted, self._cut = len(tokens), cut
        draft = Draft.chain(torch.cat(tokens).cpu(), torch.stack(qs) if qs else None)
        draft.catch_up_seconds = catch_up_seconds  # as the EAGLE drafters report theirs: kept out of c
        return draft

    def _passes(self, target: Target):
        """The draft's (hidden, logits) functions: the target's lean forward with the skip set when it runs (its
        products: the stream kernel's where the target uses it), else the model's own sub-modules."""
        lean = target.lean
        if lean is not None and lean.ready():
            return partial(lean.skipping, kept=self.kept), lean.head
        return partial(self.runner.hidden, plan=self.plan), self.runner.logits

    @torch.inference_mode()
    def propose_batch(self, drafters: list, ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """Batched decoding: one skip-layer pass per draft step for every slot, on the batch's cache without copying
        it (``batched.py``); other drafters, skip sets or contexts fall back to each slot's ``propose``."""
        if all(type(d) is type(self) and d.skipped == self.skipped for d in drafters):
            drafts = propose_self_batch(drafters, ctxs, gammas)
            if drafts is not None:
                return drafts
        return super().propose_batch(drafters, ctxs, gammas)

    def _draw(self, logits: torch.Tensor, ctx: DecodeContext):
        """(token (1,), q (V,) or None, top-1 probability or None without adaptive exit)."""
        if ctx.sampling.greedy:
            token = logits.argmax().view(1)
            confidence = torch.softmax(logits.float(), dim=-1).max() if self.exit is not None else None
            return token, None, confidence
        q = warp(logits, ctx.sampling)
        token = draw(q, ctx.generator)
        return token, q, (q.max() if self.exit is not None else None)

    def observe(self, outcome: VerifyOutcome) -> None:
        if self.exit is not None and outcome.draft_size:  # a pass without a proposal tells the exit nothing
            self.exit.update(self._drafted, len(outcome.accepted_nodes), self._cut)
