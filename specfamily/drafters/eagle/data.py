"""EAGLE training data: token streams whose features the frozen target computes on the fly, or self-distillation
data whose features were stored while the target wrote it.

A trainer sees one :class:`EagleData`: training windows (with stored features if any), held-out windows, held-out
prompts for tau, and the tokens a reduced draft vocabulary is counted on. EAGLE-3 ignores stored features (it fuses
three layers; the files hold the last) and asks for no prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specfamily.core.target import Target
from specfamily.train.tokens import dataset_tokens, fixed_windows, random_windows, split_heldout, token_array

Batch = tuple[torch.Tensor, "torch.Tensor | None"]  # tokens (B, T) long; features (B, T, H) or None (compute them)


@dataclass
class EagleData:
    sample: Callable[[int, torch.Generator], Batch]  # (batch size, generator) -> a training batch
    heldout: Batch  # fixed evaluation windows
    prompts: list[torch.Tensor]  # held-out prompts for tau
    counted: np.ndarray | torch.Tensor  # what the draft vocabulary's frequencies are counted on


def token_source(cfg, target: Target) -> EagleData:
    """Windows of a token array or dataset; the held-out split gives the evaluation windows and prompts."""
    if cfg.tokens:
        train = token_array(cfg.tokens)
    else:
        files = [f for f in cfg.data_files.split(",") if f] or None
        train = dataset_tokens(cfg.dataset, target.tokenizer, target.eos_token_id, cfg.text_field, cfg.split,
                               files, cfg.max_documents)
    if int(train.max()) >= target.vocab_size:
        raise ValueError(f"training data has token id {int(train.max())} outside the target's vocabulary")
    heldout = token_array(cfg.heldout) if cfg.heldout else None
    if heldout is None:
        split = split_heldout(train, cfg.heldout_fraction, cfg.tokens or cfg.dataset)
        train, heldout = split.train, split.heldout
    prompts = list(fixed_windows(heldout, cfg.tau_prompts, cfg.tau_prompt_len - 1)) if cfg.tau_prompts else []
    return EagleData(lambda batch, gen: (random_windows(train, batch, cfg.seq_len - 1, gen), None),
                     (fixed_windows(heldout, cfg.eval_windows, cfg.seq_len - 1), None), prompts, train)


def distilled_source(cfg, target: Target) -> EagleData:
    """Windows of stored conversations with their features; held-out conversations' chat prompts measure tau."""
    from specfamily.train.distilled import WindowSampler, load_for_target

    train, heldout = load_for_target(cfg.distilled, target, 100 * cfg.heldout_fraction)
    sampler, fixed = WindowSampler(train, cfg.seq_len), WindowSampler(heldout, cfg.seq_len)
    prompts = [torch.tensor(heldout.prompt(i)) for i in range(min(cfg.tau_prompts, len(heldout)))]
    return EagleData(sampler.sample, fixed.fixed(cfg.eval_windows), prompts, train.answer_tokens())


def load_data(cfg, target: Target) -> EagleData:
    return distilled_source(cfg, target) if cfg.distilled else token_source(cfg, target)
