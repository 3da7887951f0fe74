"""Conformance under batching: each request's law inside a batch of requests with other prompts and draft lengths.

``assert_lossless_batched(factory)`` builds the kit's tiny target, then samples requests of several prompts
interleaved in batches (``sf.generate_batch``: one target pass over every live request, ragged caches and drafts,
continuous batching when ``max_batch`` is below the batch), each prompt's requests driven at its own constant draft
length (:class:`PerPromptGamma`). Every prompt's sequences are tested against that prompt's exact law (every
position's marginal, every adjacent pair, the joint; :mod:`specfamily.testing.stats`), at the family-wise level
``significance`` over all of them. A drafter that reads another request's state (its context, q, features or cache
rows) draws from the wrong law and is rejected (:class:`CrossRequestLeak`); an honest one passes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specfamily.core.batch_loop import generate_batch
from specfamily.core.batch_slots import propose_batch
from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.types import Draft, SamplingConfig, VerifyOutcome
from specfamily.testing.conformance import ConformanceError
from specfamily.testing.rogues import CrossRequestLeak, Rogue
from specfamily.testing.sampling_run import exact_steps, joint_law
from specfamily.testing.setting import PROMPT, VOCAB
from specfamily.testing.stats import ChiSquare, sequence_tests
from specfamily.testing.tiny import single_thread, tiny_target

__all__ = ["BatchedFit", "PerPromptGamma", "assert_lossless_batched", "batched_rogue_gallery"]

PROMPTS = (PROMPT, (6, 4), (5, 0, 7, 2, 2))  # ragged prompt lengths
GAMMAS = (3, 1, 2)  # ragged draft lengths, one per prompt


class PerPromptGamma(BaseDrafter):
    """Drives ``inner`` at a constant draft length chosen by the request's prompt; records the deepest draft."""

    batch_shared = ("deepest",)

    def __init__(self, inner, gammas: dict[tuple[int, ...], int]) -> None:
        super().__init__(max(gammas.values()), "constant")
        self.inner, self.gammas = inner, gammas
        self.needs_features, self.lossy = inner.needs_features, inner.lossy
        self.deepest: dict[tuple[int, ...], int] = {}  # shared by every batch slot's copy

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.inner.begin(ctx)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        prompt = tuple(ctx.prompt_ids.tolist())
        gamma = min(gamma, self.gammas[prompt])
        draft = self.inner.propose(ctx, gamma) if gamma > 0 else Draft.empty()
        self._record(prompt, draft)
        return draft

    def propose_batch(self, drafters: list, ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """The inner drafters propose through their own family's batched call (its batched draft forwards, when it
        has them), each slot at its prompt's length."""
        prompts = [tuple(ctx.prompt_ids.tolist()) for ctx in ctxs]
        gammas = [min(g, self.gammas[p]) for g, p in zip(gammas, prompts, strict=True)]
        drafts = propose_batch(self.inner, [d.inner for d in drafters], ctxs, gammas)
        for prompt, draft in zip(prompts, drafts, strict=True):
            self._record(prompt, draft)
        return drafts

    def _record(self, prompt: tuple[int, ...], draft: Draft) -> None:
        depth = 0 if len(draft) == 0 else int(draft.depths().max())
        self.deepest[prompt] = max(self.deepest.get(prompt, 0), depth)

    def observe(self, outcome: VerifyOutcome) -> None:
        self.inner.observe(outcome)

    def end(self) -> None:
        end = getattr(self.inner, "end", None)
        if callable(end):
            end()


def batched_rogue_gallery() -> list[Rogue]:
    """Drafters that are honest alone and wrong only beside other requests: the batched kit must reject them."""
    return [Rogue("cross_request_leak", "draws from another live request's draft law, reports its own q",
                  CrossRequestLeak, SamplingConfig(1.0))]


@dataclass
class BatchedFit:
    """One batched conformance run: per prompt, its samples, depth reached and worst test."""

    sampling: SamplingConfig
    samples: int  # per prompt
    batch: int
    max_batch: int | None
    depths: dict[tuple[int, ...], int]  # deepest draft proposed per prompt
    worst: ChiSquare
    adjusted_p: float  # the worst p-value times the number of tests
    passed: bool

    def describe(self) -> str:
        return (f"{self.sampling}: {self.samples} samples per prompt in batches of {self.batch} "
                f"(max_batch={self.max_batch}), depths {self.depths}, worst {self.worst.name} "
                f"chi2={self.worst.chi2:.1f} on {self.worst.cells} cells, adjusted p={self.adjusted_p:.2e}")


def assert_lossless_batched(factory: Callable, *, sampling: SamplingConfig | None = None,
                            prompts: Sequence[Sequence[int]] = PROMPTS, gammas: Sequence[int] = GAMMAS,
                            n_tokens: int = 5, samples: int = 1500, batch: int = 6, max_batch: int | None = 4,
                            significance: float = 1e-3, family: str = "llama", vocab: int = VOCAB,
                            require_depth: bool = True) -> BatchedFit:
    """Fail unless each prompt's requests, sampled inside batches of ``batch`` interleaved requests (at most
    ``max_batch`` at once), follow that prompt's exact law; with ``require_depth``, unless each prompt's drafts
    reached its gamma. ``sampling`` None: temperature 1."""
    sampling = SamplingConfig(1.0) if sampling is None else sampling
    target = tiny_target(family, vocab_size=vocab)
    keys = [tuple(p) for p in prompts]
    drafter = PerPromptGamma(factory(target), dict(zip(keys, gammas, strict=True)))
    with single_thread():
        sequences = _sample(target, drafter, keys, n_tokens, sampling, samples, batch, max_batch)
        tests = []
        for key, rows in zip(keys, sequences, strict=True):
            joint = joint_law(exact_steps(target, key, n_tokens, sampling))
            tests += [ChiSquare(f"prompt {list(key)} {t.name}", t.chi2, t.p_value, t.cells)
                      for t in sequence_tests(rows, joint, vocab)]
    worst = min(tests, key=lambda t: t.p_value)
    adjusted = min(1.0, worst.p_value * len(tests))
    fit = BatchedFit(sampling, samples, batch, max_batch, dict(drafter.deepest), worst, adjusted,
                     adjusted >= significance)
    if not fit.passed:
        raise ConformanceError(f"not lossless under batching: {fit.describe()}", None)
    short = {k: d for k, g in zip(keys, gammas, strict=True) if (d := fit.depths.get(k, 0)) < g}
    if require_depth and short:
        raise ConformanceError(f"drafts did not reach their draft length under batching ({short}): {fit.describe()}",
                               None)
    return fit


def _sample(target, drafter, keys: list[tuple[int, ...]], n_tokens: int, sampling: SamplingConfig, samples: int,
            batch: int, max_batch: int | None) -> list[torch.Tensor]:
    """(samples, n_tokens) per prompt: requests cycle through the prompts, ``batch`` per generate_batch call, each
    request on its own seed."""
    rows: list[list[list[int]]] = [[] for _ in keys]
    total, seed = samples * len(keys), 0
    while seed < total:
        size = min(batch, total - seed)
        chosen = [(seed + i) % len(keys) for i in range(size)]
        results = generate_batch(target, drafter, [list(keys[k]) for k in chosen], max_new_tokens=n_tokens,
                                 sampling=sampling, seed=seed, max_batch=max_batch)
        for k, result in zip(chosen, results, strict=True):
            if len(result.tokens) != n_tokens:
                raise ValueError(f"a request stopped after {len(result.tokens)} of {n_tokens} tokens")
            rows[k].append(result.tokens)
        seed += size
    return [torch.tensor(r, dtype=torch.long) for r in rows]
