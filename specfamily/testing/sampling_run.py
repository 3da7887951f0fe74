"""Sampling a conformance run: generated tokens, the level each was decided at, and the exact law they follow.

A run is ``samples`` requests (seed ``first_seed + i``) of ``n_tokens`` new tokens, the drafter wrapped in a
:class:`DepthRecorder`. A request that ends at EOS is padded with it (the exact law treats EOS as absorbing), its
padded positions at level ``PAD``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfamily.core.loop import generate
from specfamily.core.types import Draft, SamplingConfig
from specfamily.testing.depth import DepthRecorder, DepthStats
from specfamily.testing.law import reference_process, reference_warp
from specfamily.testing.levels import PAD


@dataclass
class Samples:
    """Sampled sequences and the level of every token."""

    sequences: torch.Tensor  # (S, n) token ids, EOS-padded
    levels: torch.Tensor  # (S, n) level of each token (0: no draft node tried; PAD: after EOS)
    depth: DepthStats | None  # None for plain decoding
    drafts: list[tuple[list[int], Draft]] | None = None  # (context, draft) of every drafted pass, when kept

    def extended(self, more: Samples) -> Samples:
        """This run followed by ``more`` (sampled on the next seeds into the same depth record)."""
        return Samples(torch.cat([self.sequences, more.sequences]), torch.cat([self.levels, more.levels]), more.depth)

    def level_counts(self, level: int) -> torch.Tensor:
        """(S,) tokens of each sample decided at ``level``."""
        return (self.levels == level).sum(dim=1)


def _padded(tokens: list[int], n_tokens: int, eos_ids: Sequence[int], seed: int) -> list[int]:
    if len(tokens) == n_tokens:
        return tokens
    if tokens and tokens[-1] in eos_ids:
        return tokens + [tokens[-1]] * (n_tokens - len(tokens))
    raise ValueError(f"generation {seed} stopped after {len(tokens)} of {n_tokens} tokens without an EOS")


def sample_run(target, drafter, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig, samples: int,
               gamma: int | None = None, first_seed: int = 0, keep_drafts: bool = False,
               stats: DepthStats | None = None) -> Samples:
    """Generate ``samples`` requests with ``drafter`` (None: plain decoding) driven at the constant length
    ``gamma`` (None: its own policy), recording the level of every token (``keep_drafts``: and every draft) into
    ``stats`` (None: a new record)."""
    recorder = None if drafter is None else DepthRecorder(drafter, stats, gamma=gamma, keep_drafts=keep_drafts)
    rows, lengths = [], []
    for seed in range(first_seed, first_seed + samples):
        tokens = generate(target, recorder, list(prompt), max_new_tokens=n_tokens, sampling=sampling, seed=seed).tokens
        lengths.append(len(tokens))
        rows.append(_padded(tokens, n_tokens, target.eos_token_ids, seed))
    sequences = torch.tensor(rows, dtype=torch.long).view(samples, n_tokens)
    levels = torch.zeros(samples, n_tokens, dtype=torch.long)
    if recorder is not None:
        for row, recorded in enumerate(recorder.stats.levels[-samples:] if samples else []):
            levels[row, : len(recorded)] = torch.tensor(recorded, dtype=torch.long)
    for row, length in enumerate(lengths):
        levels[row, length:] = PAD
    if recorder is None:
        return Samples(sequences, levels, None)
    return Samples(sequences, levels, recorder.stats, recorder.drafts)


@torch.inference_mode()
def exact_steps(target, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig,
                chunk: int = 4096) -> list[torch.Tensor]:
    """``steps[t]`` (V ** t, V): the exact law of new token t + 1 given each prefix of t new tokens (base-V index,
    first token most significant), under p warped by :func:`specfamily.testing.law.reference_warp`, an independent
    implementation of the sampling specification, after the processors the target's generation config sets
    (:func:`specfamily.testing.law.reference_process`, transformers' own). After the target's EOS the law is EOS
    again (absorbing)."""
    model, vocab = target.model, target.vocab_size
    eos = list(target.eos_token_ids)
    steps = []
    for length in range(n_tokens):
        prefixes = torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)
        prefixes = prefixes.view(vocab**length, length)
        ids = torch.cat([torch.tensor(list(prompt)).expand(vocab**length, -1), prefixes], dim=1)  # (V^len, L+len)
        rows = []
        for batch in ids.split(chunk):
            batch = batch.to(model.device)
            logits = model(input_ids=batch, attention_mask=torch.ones_like(batch)).logits[:, -1]
            logits = reference_process(batch, logits, getattr(model, "generation_config", None), len(prompt))
            rows.append(reference_warp(logits, sampling))  # (batch, V): the law's own warp, not the loop's
        step = torch.cat(rows)
        if eos and length:
            ended = torch.isin(prefixes, torch.tensor(eos)).any(dim=1)  # a prefix that already holds an EOS
            first = torch.isin(prefixes[ended], torch.tensor(eos)).int().argmax(dim=1)  # each one's first EOS
            first_eos = prefixes[ended].gather(1, first.view(-1, 1)).view(-1)
            step[ended] = torch.nn.functional.one_hot(first_eos, vocab).double()
        steps.append(step)
    return steps


def joint_law(steps: list[torch.Tensor]) -> torch.Tensor:
    """(V ** n,) the probability of every sequence of n new tokens, the product of its steps."""
    probs = torch.ones(1, dtype=torch.float64)
    for step in steps:
        probs = (probs.view(-1, 1) * step).reshape(-1)
    return probs
