"""Medusa training data: token streams whose features the frozen target computes every step, or self-distillation data
whose features were stored while the target wrote it.

Either way the trainer sees one :class:`MedusaData`: training windows (with stored features if any), held-out
windows with features, held-out prompts for tau, and the tokens a reduced draft vocabulary is counted on
(``counted``). With distilled data the held-out windows are the target's own greedy text, and tau is measured on the
held-out conversations' chat prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specfamily.drafters.medusa.calibrate import batched_features
from specfamily.drafters.shared.draft_vocab import DraftVocab, coverage
from specfamily.train.tokens import (
    dataset_tokens,
    fixed_windows,
    greedy_windows,
    random_windows,
    split_heldout,
    zoo_tokens,
)

Batch = tuple[torch.Tensor, "torch.Tensor | None"]  # tokens (B, T) long; features (B, T, H), or None: compute them


@dataclass
class EvalSet:
    """Held-out windows with their (frozen) target features; accuracies count positions t >= start."""

    ids: torch.Tensor  # (N, T)
    features: torch.Tensor  # (N, T, H)
    start: int = 0


@dataclass
class MedusaData:
    source: str  # recorded in the exported checkpoint
    sample: Callable[[int, torch.Generator], Batch]  # (batch size, generator) -> a training batch
    corpus: EvalSet  # held-out text as it is
    greedy: EvalSet  # what the heads must predict: the target's greedy text (``corpus`` itself for distilled data)
    prompts: list[list[int]]  # held-out prompts for tau
    counted: np.ndarray | torch.Tensor  # what the draft vocabulary's frequencies are counted on
    heldout_counted: np.ndarray | torch.Tensor  # the same kind of tokens, held out (the vocabulary's coverage)


def eval_prompts(heldout: np.ndarray, count: int, length: int) -> list[list[int]]:
    """``count`` evenly spaced held-out prompts of ``length`` tokens."""
    return [row.tolist() for row in fixed_windows(heldout, count, length - 1)]


def token_source(cfg, target) -> MedusaData:
    """The zoo corpus or a dataset: features computed by the target each step; greedy continuations of held-out
    prefixes (``greedy``) are what the tree is calibrated on."""
    if cfg.data == "zoo":
        data = zoo_tokens(cfg.zoo_dir)
    else:
        eos = target.eos_token_id if target.eos_token_id is not None else 0
        data = split_heldout(dataset_tokens(cfg.data, target.tokenizer, eos, cfg.text_field), 0.05, cfg.data)
    model = target.model
    windows = fixed_windows(data.heldout, cfg.eval_windows, cfg.seq_len - 1)
    half = cfg.seq_len // 2
    continued = greedy_windows(model, windows, half, target.eos_token_id or 0)
    corpus = EvalSet(windows, batched_features(model, windows, cfg.batch))
    greedy = EvalSet(continued, batched_features(model, continued, cfg.batch), half - 1)

    def sample(batch: int, gen: torch.Generator) -> Batch:
        ids = random_windows(data.train, batch, cfg.seq_len - 1, gen).to(model.device)  # (B, T)
        if cfg.labels == "greedy":
            ids = greedy_windows(model, ids, cfg.distill_prompt, target.eos_token_id or 0)
        return ids, None

    prompts = eval_prompts(data.heldout, cfg.eval_prompts, cfg.prompt_len)
    return MedusaData(data.source, sample, corpus, greedy, prompts, data.train, data.heldout)


def distilled_source(cfg, target) -> MedusaData:
    """Windows of stored conversations with their features; held-out conversations' chat prompts measure tau."""
    from specfamily.train.distilled import WindowSampler, load_for_target

    train, heldout = load_for_target(cfg.distilled, target)
    sampler = WindowSampler(train, cfg.seq_len)
    ids, features = WindowSampler(heldout, cfg.seq_len).fixed(cfg.eval_windows)
    windows = EvalSet(ids, features)
    prompts = [heldout.prompt(i) for i in range(min(cfg.eval_prompts, len(heldout)))]
    return MedusaData(cfg.distilled, sampler.sample, windows, windows, prompts, train.answer_tokens(),
                      heldout.answer_tokens())


def load_data(cfg, target) -> MedusaData:
    return distilled_source(cfg, target) if cfg.distilled else token_source(cfg, target)


def vocab_report(vocab: DraftVocab | None, data: MedusaData) -> dict:
    """Size and coverage (share of tokens inside it: a ceiling on every head's accuracy) of a draft vocabulary."""
    if vocab is None:
        return {}
    return {"size": vocab.size, "coverage_train": round(coverage(data.counted, vocab), 4),
            "coverage_heldout": round(coverage(data.heldout_counted, vocab), 4)}
