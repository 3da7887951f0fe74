"""Medusa's typical acceptance (Cai et al. 2024, section 2.3.1): LOSSY, offered only behind an explicit option.

A draft token x at a node is accepted when the target's probability of it clears an entropy-dependent threshold,
p(x) > min(epsilon, delta * exp(-H(p))), instead of the rejection-sampling test; the committed text then no
longer follows the target's distribution exactly. The path kept is the longest one whose tokens all pass (the
first in node order on ties); the next token is sampled from the target's p after it. At temperature 0 the rule
is plain greedy matching (what Medusa does too), so greedy output stays exact. Only the rows that score a node,
and the row the next token is drawn from, are warped.
"""

from __future__ import annotations

import torch

from specfamily.core import host
from specfamily.core.sampling import greedy_tokens, warp
from specfamily.core.types import SamplingConfig
from specfamily.core.verify import greedy_tree


def typical_pass(tokens: torch.Tensor, parents: torch.Tensor, p: torch.Tensor, epsilon: float,
                 delta: float) -> torch.Tensor:
    """(n,) bool: whether each node's token clears the typical threshold under its parent's row of p.

    tokens (n,), parents (n,), p (n + 1, V): row 0 at the root, row i + 1 after node i.
    """
    return clears_threshold(tokens, parents.to(p.device) + 1, p, epsilon, delta)


def clears_threshold(tokens: torch.Tensor, rows: torch.Tensor, p: torch.Tensor, epsilon: float,
                     delta: float) -> torch.Tensor:
    """(n,) bool: whether node i's token clears the typical threshold of row ``rows[i]`` of p (r, V)."""
    p64 = p.double()
    entropy = -(p64 * torch.log(p64.clamp_min(1e-300))).sum(dim=-1)  # (r,)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)  # (r,)
    return p64[rows, tokens.to(p.device)] > threshold[rows]


def longest_passing_path(parents: list[int], passed: list[bool]) -> list[int]:
    """Node indices, root down, of the deepest node whose whole path passed (first in node order on ties)."""
    depth = [0] * len(parents)
    best, best_depth = -1, 0
    for i, parent in enumerate(parents):
        ok = passed[i] and (parent < 0 or depth[parent] > 0)
        depth[i] = (1 if parent < 0 else depth[parent] + 1) if ok else 0
        if depth[i] > best_depth:
            best, best_depth = i, depth[i]
    path = []
    while best >= 0:
        path.append(best)
        best = parents[best]
    return path[::-1]


def typical_accept(tokens: torch.Tensor, parents: torch.Tensor, logits: torch.Tensor, sampling: SamplingConfig,
                   generator: torch.Generator | None, epsilon: float = 0.09,
                   delta: float | None = None) -> tuple[list[int], int]:
    """(accepted node indices from the root down, next token) under typical acceptance; greedy at temperature 0.

    logits (n + 1, V) as the target returned them; ``delta`` defaults to sqrt(epsilon) as in Medusa.
    """
    if sampling.greedy:
        return greedy_tree(tokens, parents, greedy_tokens(logits))
    delta = epsilon**0.5 if delta is None else delta
    parent_list = parents.tolist()
    scoring = sorted({parent + 1 for parent in parent_list})  # the rows that score some node
    slot = {row: i for i, row in enumerate(scoring)}
    p = warp(logits[scoring], sampling)  # (r, V): no other row is warped unless the path ends there
    rows = torch.tensor([slot[parent + 1] for parent in parent_list], dtype=torch.long, device=logits.device)
    passed = clears_threshold(tokens, rows, p, epsilon, delta)
    path = longest_passing_path(parent_list, passed.tolist())
    end = path[-1] + 1 if path else 0  # the row the next token is drawn from
    row = p[slot[end]] if end in slot else warp(logits[end : end + 1], sampling)[0]
    next_token = host.sample(row, generator)
    return path, next_token
