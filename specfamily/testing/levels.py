"""Level-conditional goodness of fit: the tokens decided at each draft level against their own prefixes' exact p.

Pure functions on tensors. For a lossless system, a generated token follows p(. | its prefix) given everything the
verifier had seen before deciding it, so the tokens decided at **level L** (after L - 1 accepted nodes of their pass,
at a node whose children are L deep; level 0: no draft node tried) each follow their own prefix's p. An error a
drafter makes only at depth L shows in them undiluted: the power depends on N_L, the number of level-L tokens.
This needs the level fixed before the token's draw (chains, fixed-shape trees, trees whose tokens are a function of
the context); a sampled tree whose shape depends on the token it drew makes its level tests inexact.

The draws are independent given the past but not identically distributed, so they are pooled as counts against
summed probabilities: for tokens x_s with laws p_s,

    C = sum_s e_{x_s},   mu = sum_s p_s,   Sigma = sum_s (diag p_s - p_s p_s^T),
    X = (C - mu)^T Sigma^+ (C - mu)  ~  chi2(rank Sigma)

(the martingale central limit theorem). Cells whose expected count is below 5 are merged first, as in a Pearson
test. Two spaces: **tokens** (cell = token id) and **ranks** (cell k = the k-th most probable token under p_s, ties
in index order), which lines up deviations that cancel between prefixes in token space. The noncentrality under a
shift of the pooled law by total variation delta is at least 4 N_L delta^2, as for N_L identical draws
(:func:`specfamily.testing.power.detection_power`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy import stats

from specfamily.testing.stats import ChiSquare, sequence_index

SPACES = ("tokens", "ranks")
PAD = -1  # the level of a position after an end-of-sequence token (nothing was generated there)


@dataclass
class LevelTokens:
    """The tokens decided at one level, with their prefixes' exact laws."""

    level: int
    tokens: torch.Tensor  # (N,) token ids
    probs: torch.Tensor  # (N, V) p(. | prefix) of each

    def __len__(self) -> int:
        return int(self.tokens.numel())


def conditional_laws(steps: list[torch.Tensor], sequences: torch.Tensor) -> torch.Tensor:
    """(S, n, V) exact p(. | prefix) of every position of (S, n) sequences; ``steps[t]`` is (V ** t, V), the law
    of token t + 1 given each prefix of t tokens (base-V index, first token most significant)."""
    samples, n = sequences.shape
    vocab = steps[0].shape[-1]
    laws = torch.empty(samples, n, vocab, dtype=torch.float64)
    for t in range(n):
        index = sequence_index(sequences[:, :t], vocab) if t else torch.zeros(samples, dtype=torch.long)
        laws[:, t] = steps[t][index]
    return laws


def level_tokens(sequences: torch.Tensor, levels: torch.Tensor, laws: torch.Tensor, level: int) -> LevelTokens:
    """The tokens of (S, n) ``sequences`` whose (S, n) ``levels`` equal ``level``, with their (S, n, V) ``laws``."""
    mask = levels == level
    return LevelTokens(level, sequences[mask], laws[mask])


def ranked(group: LevelTokens) -> LevelTokens:
    """The same tokens in rank space: token -> its rank under its own p, p -> p sorted from the most probable."""
    if not len(group):
        return group
    sorted_probs, order = torch.sort(group.probs, dim=-1, descending=True, stable=True)  # ties in index order
    ranks = torch.argsort(order, dim=-1).gather(1, group.tokens.view(-1, 1)).view(-1)
    return LevelTokens(group.level, ranks, sorted_probs)


def merge_map(expected: torch.Tensor, min_expected: float = 5.0) -> torch.Tensor:
    """(V,) cell of each category after merging the smallest, in order of expected count, into cells of expected
    count >= ``min_expected`` (a short last cell joins the one before it)."""
    cell = torch.empty(expected.numel(), dtype=torch.long)
    current, mass = 0, 0.0
    order = torch.argsort(expected, stable=True).tolist()
    for position, index in enumerate(order):
        cell[index] = current
        mass += float(expected[index])
        if mass >= min_expected and position < len(order) - 1:
            current, mass = current + 1, 0.0
    if mass < min_expected and current > 0:  # the last cell fell short: join it to the one before
        cell[cell == current] = current - 1
    return cell


def pooled_statistic(group: LevelTokens, min_expected: float = 5.0) -> tuple[float, int]:
    """(X, degrees of freedom) of the pooled test of ``group`` after merging small cells; df 0: nothing to test."""
    if not len(group):
        return 0.0, 0
    cells = merge_map(group.probs.sum(dim=0), min_expected)
    width = int(cells.max()) + 1
    merge = torch.nn.functional.one_hot(cells, width).double()  # (V, cells)
    probs = group.probs @ merge  # (N, cells)
    counts = merge[group.tokens].sum(dim=0)
    deviation = counts - probs.sum(dim=0)
    covariance = torch.diag(probs.sum(dim=0)) - probs.T @ probs
    values, vectors = torch.linalg.eigh(covariance)
    keep = values > values.max().clamp(min=0) * 1e-9
    if not bool(keep.any()):
        return 0.0, 0
    projected = vectors[:, keep].T @ deviation
    return float((projected**2 / values[keep]).sum()), int(keep.sum())


def pooled_test(name: str, group: LevelTokens) -> ChiSquare | None:
    """The pooled chi-square test of one level's tokens (None when fewer than two cells are left to compare)."""
    chi2, df = pooled_statistic(group)
    if df < 1:
        return None
    return ChiSquare(name, chi2, float(stats.chi2.sf(chi2, df)), df + 1)


def level_tests(sequences: torch.Tensor, levels: torch.Tensor, laws: torch.Tensor,
                depth: int) -> tuple[list[ChiSquare], list[int]]:
    """Pooled tests, in token and rank space, of the tokens decided at each level 0..``depth``, and the number of
    tokens at each level (index = level)."""
    tests, counts = [], []
    for level in range(depth + 1):
        group = level_tokens(sequences, levels, laws, level)
        counts.append(len(group))
        for space, view in zip(SPACES, (group, ranked(group)), strict=True):
            test = pooled_test(f"level {level} {space}", view)
            if test is not None:
                tests.append(test)
    return tests, counts
