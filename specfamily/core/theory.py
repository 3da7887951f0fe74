"""Leviathan et al. (2022) formulas for speculative decoding, as pure functions on floats.

alpha = probability that one draft token is accepted (assumed i.i.d. per position), gamma = draft
length, c = cost of one draft step relative to one target pass, verify_cost = cost of the target
pass over gamma + 1 tokens relative to a pass over one token, t(gamma + 1) / t(1) (the paper
assumes 1; on a CPU it is not).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence

import torch

VerifyCost = float | Callable[[int], float] | None  # t(gamma + 1) / t(1): fixed, per gamma, or 1


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 <= alpha <= 1.0:  # also rejects nan
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return alpha


def check_int(gamma: int, name: str = "gamma", minimum: int = 0) -> int:
    """``gamma`` as an int >= ``minimum`` (bools and non-integers refused), or a ValueError naming ``name``."""
    if isinstance(gamma, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {gamma!r}")
    try:
        gamma = operator.index(gamma)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {gamma!r}") from None
    if gamma < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {gamma!r}")
    return gamma


def _check_c(c: float, name: str = "c") -> float:
    c = float(c)
    if not (math.isfinite(c) and c >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0, got {c!r}")
    return c


def _verify_cost_at(verify_cost: VerifyCost, gamma: int) -> float:
    """t(gamma + 1) / t(1) for this gamma: 1 when None, the float, or the callable's value."""
    cost = 1.0 if verify_cost is None else verify_cost(gamma) if callable(verify_cost) else verify_cost
    cost = float(cost)
    if not (math.isfinite(cost) and cost > 0.0):
        raise ValueError(f"verify_cost must be a finite number > 0, got {cost!r} at gamma={gamma}")
    return cost


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """E[tokens per target pass] = (1 - alpha^(gamma + 1)) / (1 - alpha); gamma + 1 when alpha = 1."""
    alpha, gamma = _check_alpha(alpha), check_int(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float, verify_cost: VerifyCost = None) -> float:
    """Expected wall-time improvement over plain decoding: tokens per pass / (gamma * c + verify_cost).

    ``verify_cost`` is a float, a callable ``gamma -> t(gamma + 1) / t(1)`` (a measured cost curve),
    or None for the paper's assumption of 1.
    """
    tokens = expected_tokens_per_pass(alpha, gamma)
    c, gamma = _check_c(c), check_int(gamma)
    return tokens / (gamma * c + _verify_cost_at(verify_cost, gamma))


def optimal_gamma(alpha: float, c: float, verify_cost: VerifyCost = None, max_gamma: int = 32) -> int:
    """The integer gamma in [1, max_gamma] that maximises ``expected_speedup`` (the smallest on ties).

    Always returns a gamma >= 1, even when no gamma gives a speedup above 1 (a poor drafter or a
    costly one); compare ``expected_speedup`` at the result with 1 to decide whether to draft at all.
    """
    alpha, c = _check_alpha(alpha), _check_c(c)
    max_gamma = check_int(max_gamma, "max_gamma", minimum=1)
    speedups = [expected_speedup(alpha, gamma, c, verify_cost) for gamma in range(1, max_gamma + 1)]
    return 1 + max(range(max_gamma), key=speedups.__getitem__)


def acceptance_rate(p: torch.Tensor | Sequence[float], q: torch.Tensor | Sequence[float]) -> float:
    """Expected acceptance at one position: sum_x min(p(x), q(x)) = 1 - total variation distance."""
    p64 = torch.as_tensor(p, dtype=torch.float64)
    q64 = torch.as_tensor(q, dtype=torch.float64)
    if p64.shape != q64.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p64.shape)} and {tuple(q64.shape)}")
    if bool((p64 < 0).any()) or bool((q64 < 0).any()):
        raise ValueError("p and q must be non-negative")
    return float(torch.minimum(p64, q64).sum())


def expected_tokens_by_depth(acceptance: Sequence[float], gamma: int) -> float:
    """E[tokens per pass] for a draft of ``gamma`` tokens whose depth-d token is accepted with probability
    ``acceptance[d - 1]`` given that every shallower one was: 1 + sum over d <= gamma of the product of the first d.

    With every entry equal to alpha this is ``expected_tokens_per_pass(alpha, gamma)``; measured per depth it also
    fits drafters whose acceptance is far from i.i.d. (prompt lookup: a matched copy tends to go on matching).
    """
    gamma = check_int(gamma)
    if gamma > len(acceptance):
        raise ValueError(f"gamma {gamma} exceeds the {len(acceptance)} depths given")
    tokens, reach = 1.0, 1.0
    for a in acceptance[:gamma]:
        reach *= _check_alpha(a)
        tokens += reach
    return tokens


def best_draft_length(
    acceptance: Sequence[float], c: float, verify_cost: VerifyCost = None, min_speedup: float = 1.0,
    overhead: float = 0.0,
) -> tuple[int, float]:
    """(gamma, expected speedup) maximising tokens per pass / (gamma c + overhead + verify_cost(gamma)) over
    gamma in [0, len(acceptance)]; gamma 0 (plain decoding, speedup 1) unless some gamma beats ``min_speedup``.
    ``overhead``: a drafter's fixed cost per drafted pass, in one-token target passes (0: none)."""
    c = _check_c(c)
    overhead = _check_c(overhead, "overhead")
    best, best_speedup = 0, 1.0
    tokens, reach = 1.0, 1.0  # expected_tokens_by_depth, accumulated one depth at a time
    for gamma, a in enumerate(acceptance, start=1):
        reach *= _check_alpha(a)
        tokens += reach
        speedup = tokens / (gamma * c + overhead + _verify_cost_at(verify_cost, gamma))
        if speedup > best_speedup:
            best, best_speedup = gamma, speedup
    return (best, best_speedup) if best_speedup > min_speedup else (0, 1.0)
