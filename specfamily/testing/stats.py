"""Goodness of fit of sampled token sequences against their exact law: marginals, adjacent pairs, the joint. Pure
functions: ``sequences`` (S, n) sampled ids; ``joint`` (V ** n,) each sequence's exact probability (base-V index,
first token most significant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy import stats


@dataclass
class ChiSquare:
    """One goodness-of-fit test: which statistic, its value, its p-value and the cells after pooling."""

    name: str  # "position 2", "pair 2-3", "joint"
    chi2: float
    p_value: float
    cells: int


def pool_cells(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0):
    """Merge the smallest cells, in order of expected count, into buckets of expected >= min_expected."""
    order = torch.argsort(expected)
    obs_buckets, exp_buckets = [], []
    obs_acc = exp_acc = 0.0
    for index in order.tolist():
        obs_acc += float(observed[index])
        exp_acc += float(expected[index])
        if exp_acc >= min_expected:
            obs_buckets.append(obs_acc)
            exp_buckets.append(exp_acc)
            obs_acc = exp_acc = 0.0
    if exp_acc > 0 or obs_acc > 0:  # a short last bucket joins the one before it
        if exp_buckets:
            obs_buckets[-1] += obs_acc
            exp_buckets[-1] += exp_acc
        else:
            obs_buckets.append(obs_acc)
            exp_buckets.append(exp_acc)
    return torch.tensor(obs_buckets), torch.tensor(exp_buckets)


def chi_square(observed: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Goodness of fit after pooling small cells: (chi2, p-value, cells). Needs at least two cells."""
    obs, exp = pool_cells(observed, probs * observed.sum(), min_expected)
    if obs.numel() < 2:
        raise ValueError(f"{int(observed.sum())} samples are too few for a chi-square test: raise `samples`")
    return _pearson(obs, exp)


def _pearson(obs: torch.Tensor, exp: torch.Tensor) -> tuple[float, float, int]:
    result = stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item())
    return float(result.statistic), float(result.pvalue), int(obs.numel())


def sequence_index(sequences: torch.Tensor, vocab: int) -> torch.Tensor:
    """(S,) base-``vocab`` index of each row of (S, n) token ids, the first token most significant."""
    weights = vocab ** torch.arange(sequences.shape[1] - 1, -1, -1, dtype=torch.long)
    return (sequences.long() * weights).sum(dim=1)


def marginal_law(joint: torch.Tensor, vocab: int, n_tokens: int, positions: tuple[int, ...]) -> torch.Tensor:
    """(V ** len(positions),) exact law of the tokens at ``positions`` (0-based, increasing) from the joint."""
    table = joint.view((vocab,) * n_tokens)
    others = tuple(d for d in range(n_tokens) if d not in positions)
    return (table.sum(dim=others) if others else table).reshape(-1)


def _test(name: str, index: torch.Tensor, law: torch.Tensor) -> ChiSquare:
    """One test; a law that leaves a single cell after pooling (all but one outcome expected < 5 times in all) has
    nothing to compare: p-value 1 (a sample off the law's support is counted by :func:`impossible_samples`)."""
    counts = torch.bincount(index, minlength=law.numel()).double()
    obs, exp = pool_cells(counts, law * counts.sum())
    if obs.numel() < 2:
        return ChiSquare(name, 0.0, 1.0, 1)
    return ChiSquare(name, *_pearson(obs, exp))


def sequence_tests(sequences: torch.Tensor, joint: torch.Tensor, vocab: int) -> list[ChiSquare]:
    """Chi-square tests of every position's marginal, every adjacent pair and the joint (2n tests in all)."""
    n = sequences.shape[1]
    tests = []
    for t in range(n):
        tests.append(_test(f"position {t + 1}", sequences[:, t].long(), marginal_law(joint, vocab, n, (t,))))
    for t in range(n - 1):
        index = sequence_index(sequences[:, t : t + 2], vocab)
        tests.append(_test(f"pair {t + 1}-{t + 2}", index, marginal_law(joint, vocab, n, (t, t + 1))))
    tests.append(_test("joint", sequence_index(sequences, vocab), joint))
    return tests


def impossible_samples(sequences: torch.Tensor, joint: torch.Tensor, vocab: int) -> int:
    """Samples that landed on a sequence of exact probability 0."""
    return int((joint[sequence_index(sequences, vocab)] == 0).sum())
