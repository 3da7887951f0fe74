"""Logits -> probabilities: temperature, top-k, softmax, top-p (the order transformers uses).

The same function warps the target's p and a drafter's q.
"""

from __future__ import annotations

import torch

from specfamily.core.types import SamplingConfig


def greedy_probs(logits: torch.Tensor) -> torch.Tensor:
    """One-hot at the argmax: p at temperature 0."""
    probs = torch.zeros_like(logits, dtype=torch.float32)
    return probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Mask everything below the k-th largest value; ties at the k-th value are kept."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most probable tokens until their mass reaches top_p (the crossing token kept)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    keep_sorted = mass_before < top_p
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities under ``sampling``."""
    if sampling.greedy:
        return greedy_probs(logits)
    scaled = logits.float() / sampling.temperature
    probs = torch.softmax(top_k_filter(scaled, sampling.top_k), dim=-1)
    return top_p_filter(probs, sampling.top_p)
