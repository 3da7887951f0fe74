"""Calibration: features of an unmodified transformers model, per-head top-k accuracies, the target's verify cost
t(n) / t(1) on this machine, and the default tree chosen from both. Heads over a reduced draft vocabulary are scored
on the target ids of their top-k: a label outside the draft vocabulary is a miss at every rank, as at decode time.
"""

from __future__ import annotations

import inspect
import statistics
from dataclasses import asdict, dataclass

import torch

from specfamily.core.costs import max_positions, measure_pass_seconds, process_clock
from specfamily.drafters.medusa.heads import MedusaHeads
from specfamily.drafters.medusa.tree import CostCurve, JointRanks, choose_tree, expected_accepted

COST_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def target_features(model, ids: torch.Tensor) -> torch.Tensor:
    """(B, T, H) last hidden state after the final norm (what the LM head reads), via ``output_hidden_states``."""
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True, use_cache=False,
                    **extra)
    return out.hidden_states[-1]


@torch.no_grad()
def head_hits(heads: MedusaHeads, features: torch.Tensor, ids: torch.Tensor, ranks: int,
              start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """hits (K, ranks): how often head k's rank-r token at position t is the token at t + 2 + k, over t >= start;
    counts (K,): positions scored. features (B, T, H), ids (B, T) of the same windows (target token ids).
    """
    k_heads, (b, t) = heads.shape.num_heads, ids.shape
    hits = torch.zeros(k_heads, ranks, dtype=torch.long)
    counts = torch.zeros(k_heads, dtype=torch.long)
    for k, head in enumerate(heads.heads):
        end = t - 2 - k
        if end <= start:
            continue
        logits = head(features[:, start:end], heads.lm_head)  # (B, end - start, V)
        top = heads.token_ids(logits.topk(ranks, dim=-1).indices)  # (B, end - start, ranks) target ids
        labels = ids[:, start + 2 + k :].to(top.device)  # (B, end - start)
        hits[k] = (top == labels[..., None]).sum(dim=(0, 1)).cpu()
        counts[k] = b * (end - start)
    return hits, counts


def head_accuracies(heads: MedusaHeads, features: torch.Tensor, ids: torch.Tensor, ranks: int = 10,
                    start: int = 0, batch: int = 8) -> torch.Tensor:
    """(K, ranks) probability that head k's rank-r candidate is the right token, over windows ids (N, T) with
    their target features (N, T, H), scoring positions t >= start."""
    total_hits, total = 0, 0
    device = next(heads.parameters()).device
    for first in range(0, ids.shape[0], batch):
        rows = slice(first, first + batch)
        hits, counts = head_hits(heads, features[rows].to(device), ids[rows], ranks, start)
        total_hits, total = total_hits + hits, total + counts
    return total_hits.double() / total.clamp_min(1)[:, None]


def _medusa_logits(heads: MedusaHeads, x: torch.Tensor, y: torch.Tensor, start: int, end: int) -> list[torch.Tensor]:
    return [head(x[:, start:end], heads.lm_head) for head in heads.heads]


@torch.no_grad()
def rank_table(heads: MedusaHeads, features: torch.Tensor, ids: torch.Tensor, ranks: int, start: int = 0,
               batch: int = 8, logits_of=_medusa_logits) -> torch.Tensor:
    """(N, K): at every position t >= start where all K heads have a label, the rank of the token at t + 2 + k
    in head k's top-``ranks`` (``ranks`` when it is not in it). features (B, T, H), ids (B, T).
    ``logits_of(heads, x, y, start, end)``: each head's logits at positions start .. end - 1 of a batch."""
    k_heads, t = heads.shape.num_heads, ids.shape[1]
    end = t - 1 - k_heads  # positions t < end have labels for every head
    if end <= start:
        raise ValueError(f"windows of {t} tokens are too short for {k_heads} heads from position {start}")
    device = next(heads.parameters()).device
    rows = []
    for first in range(0, ids.shape[0], batch):
        x, y = features[first : first + batch].to(device), ids[first : first + batch].to(device)
        per_head = []
        for k, logits in enumerate(logits_of(heads, x, y, start, end)):
            top = heads.token_ids(logits.topk(ranks, dim=-1).indices)  # (b, L, ranks)
            hit = top == y[:, start + 2 + k : end + 2 + k, None]  # (b, L, ranks)
            per_head.append(torch.where(hit.any(dim=-1), hit.int().argmax(dim=-1), ranks))  # (b, L)
        rows.append(torch.stack(per_head, dim=-1).reshape(-1, k_heads).cpu())
    return torch.cat(rows)


def batched_features(model, windows: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """(N, T, H) target features of windows (N, T), computed ``batch`` windows at a time."""
    device = next(model.parameters()).device
    return torch.cat([target_features(model, windows[i : i + batch].to(device)) for i in
                      range(0, windows.shape[0], batch)])


def _timed(fn, clock) -> float:
    started = clock()
    fn()
    return clock() - started


def measure_verify_cost(target, max_size: int = 65, context: int = 256, repeats: int = 7,
                        seed: int = 0) -> tuple[CostCurve, float]:
    """The cost curve t(n) / t(1) of one target pass over n fed tokens (n <= max_size) after ``context`` cached
    random tokens, made non-decreasing in n, and t(1) in seconds (``specfamily.core.costs``)."""
    sizes = tuple(n for n in COST_SIZES if n < max_size) + (max_size,)
    limit = max_positions(target) or 1 << 20
    context = max(2, min(context, limit - max_size - (repeats + 1) * len(sizes) - 1))
    ids = torch.randint(0, target.vocab_size, (context,), generator=torch.Generator().manual_seed(seed)).tolist()
    seconds = measure_pass_seconds(target, ids, [n - 1 for n in sizes], repeats, process_clock(target.device),
                                   features=True)
    ratios, running = [], 0.0
    for n in sizes:
        running = max(running, seconds[n - 1] / seconds[0])
        ratios.append(running)
    return CostCurve(tuple(sizes), tuple(ratios)), seconds[0]


@torch.inference_mode()
def measure_heads_cost(heads: MedusaHeads, top_k: int, seconds_per_pass: float, repeats: int = 20) -> float:
    """c: time of one proposal (all heads on one feature, then top-k) relative to one target pass t(1)."""
    feature = torch.zeros(heads.shape.hidden_size, device=next(heads.parameters()).device)
    feature = feature.to(next(heads.parameters()).dtype)
    heads(feature)  # warm-up
    clock = process_clock(feature.device)
    seconds = statistics.median(_timed(lambda: heads(feature).topk(top_k, dim=-1), clock) for _ in range(repeats))
    return seconds / seconds_per_pass


@dataclass
class Calibration:
    """What a calibration measured and the tree it chose (stored in the checkpoint's config)."""

    accuracies: list[list[float]]  # (K, ranks)
    top1: list[float]  # (K,)
    top5: list[float]  # (K,)
    cost_sizes: list[int]
    cost_ratios: list[float]
    c: float
    tree: list[list[int]]  # chosen from the joint rank statistics (JointRanks), not from the per-head accuracies
    expected_accepted: float  # sum of the tree's node probabilities (greedy)

    def as_dict(self) -> dict:
        return asdict(self)


def calibrate(accuracies: torch.Tensor, ranks: torch.Tensor, curve: CostCurve, c: float,
              max_nodes: int = 64) -> Calibration:
    """Choose the tree maximising the expected speedup from the measured rank table (N, K) and verify cost;
    record the per-head accuracies (K, ranks) with it."""
    model = JointRanks(ranks, accuracies.shape[1])
    paths = choose_tree(model, curve, c, max_nodes)
    top5 = accuracies[:, :5].sum(dim=1)
    return Calibration(accuracies.tolist(), accuracies[:, 0].tolist(), top5.tolist(), list(curve.sizes),
                       list(curve.ratios), c, [list(p) for p in paths], expected_accepted(paths, model))
