"""Medusa token trees: rank paths, their buffers, and trees built from measured head accuracies.

A tree is a list of rank paths: ``(r1, ..., rd)`` is the node at depth d carrying the rank-rd candidate of head
d - 1, below ``(r1, ..., r(d-1))``; every prefix is in the tree, nodes are ordered by depth then lexicographically.
A node's acceptance probability comes from a path model: ``IndependentHeads(acc)`` (Medusa's ``mc_sim``:
``prod_d acc[d - 1][r_d]``) or ``JointRanks`` (the empirical frequency of the right tokens having exactly the node's
ranks). The expected number of accepted draft tokens is the sum of the nodes' probabilities.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specfamily.core.costs import verify_cost_at

Path = tuple[int, ...]


@dataclass(frozen=True)
class MedusaTree:
    """Buffers of one tree, built once: parents, depths, ranks, the top-k gather index and the retrieval paths."""

    paths: tuple[Path, ...]  # sorted by (depth, path)
    parents: torch.Tensor  # (n,) long, -1 for children of the root
    depths: torch.Tensor  # (n,) long, 1 for children of the root
    ranks: torch.Tensor  # (n,) long, the rank of each node's token in its head's top-k
    gather: torch.Tensor  # (n,) long: (depth - 1) * top_k + rank, an index into a flat (depth, top_k) top-k table
    retrieval: torch.Tensor  # (leaves, depth) node indices from depth 1 down to each leaf, -1 padded
    prefix: tuple[int, ...]  # prefix[g]: number of nodes of depth <= g (g = 0 .. depth)
    top_k: int  # 1 + the largest rank used

    @property
    def size(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.prefix) - 1

    def parents_at(self, gamma: int) -> torch.Tensor:
        """(n_gamma,) parents of the tree cut at depth gamma (a prefix of the node order)."""
        return self.parents[: self.prefix[min(gamma, self.depth)]]


def _check_paths(paths: Sequence[Sequence[int]]) -> list[Path]:
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
        raise TypeError(f"a Medusa tree is a list of rank paths (tuples of ints), got {type(paths).__name__}")
    out = []
    for path in paths:
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or len(path) == 0:
            raise ValueError(f"every tree path must be a non-empty tuple of ranks, got {path!r}")
        if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise ValueError(f"tree ranks must be integers >= 0, got {path!r}")
        out.append(tuple(path))
    if not out:
        raise ValueError("a Medusa tree needs at least one path")
    if len(set(out)) != len(out):
        raise ValueError("tree paths must be distinct")
    known = set(out)
    for path in out:
        if len(path) > 1 and path[:-1] not in known:
            raise ValueError(f"tree path {path} has no parent {path[:-1]} in the tree")
    return sorted(out, key=lambda p: (len(p), p))


def build_tree(paths: Sequence[Sequence[int]]) -> MedusaTree:
    """Validate the rank paths (prefix-closed, distinct) and build the tree's buffers."""
    ordered = _check_paths(paths)
    index = {path: i for i, path in enumerate(ordered)}
    parents = [index[p[:-1]] if len(p) > 1 else -1 for p in ordered]
    depths = [len(p) for p in ordered]
    ranks = [p[-1] for p in ordered]
    top_k = 1 + max(ranks)
    depth = max(depths)
    prefix = tuple(sum(1 for d in depths if d <= g) for g in range(depth + 1))
    has_child = {parent for parent in parents if parent >= 0}
    leaves = [i for i in range(len(ordered)) if i not in has_child]
    retrieval = torch.full((len(leaves), depth), -1, dtype=torch.long)
    for row, leaf in enumerate(leaves):
        path = ordered[leaf]
        retrieval[row, : len(path)] = torch.tensor([index[path[: d + 1]] for d in range(len(path))])
    return MedusaTree(
        paths=tuple(ordered),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        ranks=torch.tensor(ranks, dtype=torch.long),
        gather=torch.tensor([(d - 1) * top_k + r for d, r in zip(depths, ranks, strict=True)], dtype=torch.long),
        retrieval=retrieval,
        prefix=prefix,
        top_k=top_k,
    )


def chain_paths(depth: int) -> list[Path]:
    """The top-1 chain of the given depth: (0,), (0, 0), ..."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"chain depth must be an integer >= 1, got {depth!r}")
    return [(0,) * d for d in range(1, depth + 1)]


class IndependentHeads:
    """Path probabilities from per-head accuracies ``acc[k][r]``, heads assumed independent (Medusa's mc_sim)."""

    def __init__(self, acc: Sequence[Sequence[float]]) -> None:
        self.acc = [[float(a) for a in row] for row in acc]
        if not self.acc or any(not row for row in self.acc):
            raise ValueError("accuracies must be a non-empty (heads, ranks) table")
        if any(not 0.0 <= a <= 1.0 for row in self.acc for a in row):
            raise ValueError("accuracies must lie in [0, 1]")
        self.num_heads = len(self.acc)

    def __call__(self, path: Path) -> float:
        return math.prod(self.acc[d][r] for d, r in enumerate(path))

    def children(self, path: Path, prob: float) -> list[tuple[int, float]]:
        return [(r, prob * a) for r, a in enumerate(self.acc[len(path)])]


class JointRanks:
    """Empirical path probabilities from calibration data, with no independence assumption.

    ``ranks`` (N, K): at each of N positions, the rank of the right token in head k's top-k (``top_k`` = missed).
    A node is accepted at a position exactly when the ranks there start with the node's rank path.
    """

    def __init__(self, ranks: torch.Tensor, top_k: int) -> None:
        if ranks.dim() != 2 or ranks.shape[0] == 0 or ranks.shape[1] == 0:
            raise ValueError(f"rank table must be a non-empty (positions, heads) tensor, got {tuple(ranks.shape)}")
        self.ranks, self.top_k, self.num_heads = ranks.long().cpu(), top_k, ranks.shape[1]

    def _matching(self, path: Path) -> torch.Tensor:
        prefix = torch.tensor(path, dtype=torch.long)
        return (self.ranks[:, : len(path)] == prefix).all(dim=1)

    def __call__(self, path: Path) -> float:
        return float(self._matching(path).double().mean())

    def children(self, path: Path, prob: float) -> list[tuple[int, float]]:
        counts = torch.bincount(self.ranks[self._matching(path), len(path)], minlength=self.top_k + 1)
        return [(r, float(counts[r]) / self.ranks.shape[0]) for r in range(self.top_k)]


PathModel = IndependentHeads | JointRanks


def _model(model: PathModel | Sequence[Sequence[float]]) -> PathModel:
    return model if isinstance(model, (IndependentHeads, JointRanks)) else IndependentHeads(model)


def path_probability(path: Path, model: PathModel | Sequence[Sequence[float]]) -> float:
    """Probability that the node at ``path`` is accepted (greedy): per-head accuracies or a rank table."""
    return _model(model)(tuple(path))


def expected_accepted(paths: Sequence[Path], model: PathModel | Sequence[Sequence[float]]) -> float:
    """Expected number of accepted draft tokens of a tree: the sum of its nodes' path probabilities."""
    model = _model(model)
    return sum(model(tuple(p)) for p in paths)


def greedy_paths(model: PathModel | Sequence[Sequence[float]], budget: int) -> list[Path]:
    """The ``budget`` nodes of largest path probability, added best first (a prefix-closed tree).

    ``model``: per-head accuracies ``acc[k][r]`` (independence assumption) or a :class:`JointRanks`. A path's
    probability never exceeds its parent's, so the best-first order is also a valid growth order, and every
    prefix of the returned list is the best tree of its size under the model.
    """
    model = _model(model)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"node budget must be an integer >= 1, got {budget!r}")
    heap = [(-prob, (r,)) for r, prob in model.children((), 1.0)]
    heapq.heapify(heap)
    chosen: list[Path] = []
    while heap and len(chosen) < budget:
        neg_prob, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < model.num_heads:
            for r, prob in model.children(path, -neg_prob):
                heapq.heappush(heap, (-prob, path + (r,)))
    return chosen


@dataclass(frozen=True)
class CostCurve:
    """Measured t(n) / t(1) of one target pass over n fed tokens; linear in between and beyond."""

    sizes: tuple[int, ...]  # increasing, starting at 1
    ratios: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.ratios) or len(self.sizes) < 2 or self.sizes[0] != 1:
            raise ValueError("a cost curve needs at least two sizes, starting at 1, one ratio each")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:], strict=False)):
            raise ValueError(f"cost curve sizes must increase, got {self.sizes}")
        if any(not (math.isfinite(r) and r > 0) for r in self.ratios):
            raise ValueError(f"cost ratios must be finite and > 0, got {self.ratios}")

    def __call__(self, n: int) -> float:
        """t(n) / t(1) for n fed tokens (the root and n - 1 draft tokens)."""
        return max(1e-6, verify_cost_at({size - 1: r for size, r in zip(self.sizes, self.ratios, strict=True)}, n - 1))


def tree_speedups(model: PathModel | Sequence[Sequence[float]], cost: Callable[[int], float], c: float,
                  max_nodes: int) -> list[float]:
    """Expected speedup over plain decoding of the greedy tree of n = 1 .. max_nodes nodes.

    speedup(n) = (1 + E[accepted](n)) / (t(n + 1) / t(1) + c), with c the heads' cost relative to t(1).
    """
    model = _model(model)
    speedups, expected = [], 0.0
    for n, path in enumerate(greedy_paths(model, max_nodes), start=1):
        expected += model(path)
        speedups.append((1.0 + expected) / (cost(n + 1) + c))
    return speedups


def choose_tree(model: PathModel | Sequence[Sequence[float]], cost: Callable[[int], float], c: float = 0.0,
                max_nodes: int = 64) -> list[Path]:
    """The greedy tree whose size maximises the expected speedup (the smallest size on ties)."""
    speedups = tree_speedups(model, cost, c, max_nodes)
    best = 1 + max(range(len(speedups)), key=speedups.__getitem__)
    return greedy_paths(model, best)


def nominal_accuracies(num_heads: int, ranks: int = 8) -> list[list[float]]:
    """A typical trained-head profile (top-1 about 0.6 at head 0, falling with depth and rank).

    Used only for the default tree of heads that carry no calibration (``weights="random"``).
    """
    return [[0.6 * 0.7**k * 0.4**r for r in range(ranks)] for k in range(num_heads)]
