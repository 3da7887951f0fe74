"""A second, deliberately plain implementation of the sampling warp, used only for the exact law.

If the law were computed with :func:`specfamily.core.sampling.warp`, a warp bug would move the loop and the law
together and stay invisible. This re-derives the same specification (DESIGN.md, "Sampling") sharing no code with it:
python floats in double precision, one row at a time.

1. temperature 0: one-hot at the first largest logit;
2. logits / temperature;
3. top-k (k > 0): keep every logit >= the k-th largest (ties at the k-th value kept);
4. softmax over what is kept;
5. top-p (< 1): from the most probable token down (ties in index order), keep each while the mass kept before it is
   below top_p (the crossing token kept), renormalise.

:func:`reference_process` applies a target's generation-config logits processors first, with transformers' own
classes over each row's whole context, independently of ``specfamily.core.processors``.
"""

from __future__ import annotations

import math

import torch
from transformers import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from specfamily.core.types import SamplingConfig


def reference_probs(logits: list[float], sampling: SamplingConfig) -> list[float]:
    """One row of logits -> its probabilities under ``sampling``, by the specification, in python floats."""
    if sampling.greedy:
        best = max(range(len(logits)), key=lambda i: (logits[i], -i))  # the first of the largest
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    scaled = [value / sampling.temperature for value in logits]
    kept = _top_k(scaled, sampling.top_k)
    probs = _softmax(scaled, kept)
    return _top_p(probs, sampling.top_p)


def _top_k(scaled: list[float], k: int) -> list[bool]:
    """Which tokens top-k keeps: every value >= the k-th largest (all of them for k = 0 or k >= V)."""
    if k <= 0 or k >= len(scaled):
        return [True] * len(scaled)
    kth = sorted(scaled, reverse=True)[k - 1]
    return [value >= kth for value in scaled]


def _softmax(scaled: list[float], kept: list[bool]) -> list[float]:
    top = max(value for value, keep in zip(scaled, kept, strict=True) if keep)
    weights = [math.exp(value - top) if keep else 0.0 for value, keep in zip(scaled, kept, strict=True)]
    total = math.fsum(weights)
    return [weight / total for weight in weights]


def _top_p(probs: list[float], top_p: float) -> list[float]:
    """Keep the most probable tokens while the mass before each is below top_p; renormalise."""
    if top_p >= 1.0:
        return probs
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    kept, mass = [0.0] * len(probs), 0.0
    for i in order:
        if mass >= top_p or probs[i] == 0.0:
            break
        kept[i] = probs[i]
        mass += probs[i]
    total = math.fsum(kept)
    return [value / total for value in kept]


def reference_warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) float64 probabilities, row by row through :func:`reference_probs`."""
    rows = logits.detach().double().cpu().reshape(-1, logits.shape[-1]).tolist()
    probs = [reference_probs(row, sampling) for row in rows]
    return torch.tensor(probs, dtype=torch.float64).reshape(logits.shape)


def reference_processors(generation_config, prompt_length: int) -> LogitsProcessorList:
    """transformers' processors for the settings specfamily applies, in ``generate()``'s order (transformers 5.24,
    GenerationMixin._get_logits_processor); the minimum lengths only with an end-of-sequence id, as there."""
    config, processors = generation_config, LogitsProcessorList()
    if config is None:
        return processors
    eos = config.eos_token_id
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(float(config.repetition_penalty)))
    if config.no_repeat_ngram_size is not None and config.no_repeat_ngram_size > 0:
        processors.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if eos is not None and config.min_length is not None and config.min_length > 0:
        processors.append(MinLengthLogitsProcessor(config.min_length, eos))
    if eos is not None and config.min_new_tokens is not None and config.min_new_tokens > 0:
        processors.append(MinNewTokensLengthLogitsProcessor(prompt_length, config.min_new_tokens, eos))
    if config.suppress_tokens is not None:
        processors.append(SuppressTokensLogitsProcessor(config.suppress_tokens))
    if config.begin_suppress_tokens is not None:
        processors.append(SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, prompt_length))
    return processors


def reference_process(ids: torch.Tensor, logits: torch.Tensor, generation_config,
                      prompt_length: int) -> torch.Tensor:
    """(B, V) float64 scores of the next token after each row of ``ids`` (B, L), the whole context each row has,
    after :func:`reference_processors`; the logits unchanged (in float64) when none is set."""
    scores = logits.detach().double()
    processors = reference_processors(generation_config, prompt_length)
    return processors(ids.to(scores.device), scores) if processors else scores
