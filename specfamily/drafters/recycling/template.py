"""Static draft-tree templates and the pure growth of a token tree from an adjacency table.

A template is a tree of *ranks*: a node of rank r proposes its parent token's r-th most likely successor. Its nodes
are ordered by depth + summed rank (stable), so every prefix of the order is itself a tree (a parent's key is
smaller than its child's) and :func:`make_template` cuts it to ``max_tree_size`` nodes by dropping the least likely.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

# Children per node, by the node's rank path: Token Recycling's static tree "2.2.2" (80 nodes, depth 6, ranks < 8);
# wide near the root and along the top-ranked spine, as the reference's template.
_WIDTHS_222: dict[tuple[int, ...], int] = {
    (): 8,
    (0,): 8, (1,): 4, (2,): 3, (3,): 2, (4,): 1, (5,): 1, (6,): 1, (7,): 1,
    (0, 0): 8, (0, 1): 3, (0, 2): 2, (0, 3): 1, (0, 4): 1, (0, 5): 1, (0, 6): 1, (0, 7): 1,
    (1, 0): 2, (1, 1): 1, (2, 0): 1, (3, 0): 1, (4, 0): 1, (5, 0): 1,
    (0, 0, 0): 5, (0, 0, 1): 2, (0, 0, 2): 1, (0, 0, 3): 1, (0, 0, 4): 1,
    (0, 1, 0): 1, (0, 2, 0): 1, (1, 0, 0): 1, (2, 0, 0): 1, (3, 0, 0): 1,
    (0, 0, 0, 0): 3, (0, 0, 0, 1): 1, (0, 0, 0, 2): 1, (0, 0, 1, 0): 1, (0, 1, 0, 0): 1, (1, 0, 0, 0): 1,
    (0, 0, 0, 0, 0): 2, (0, 0, 0, 1, 0): 1,
}
TEMPLATES: dict[str, dict[tuple[int, ...], int]] = {"2.2.2": _WIDTHS_222}


@dataclass(frozen=True)
class Template:
    """A rank tree in a parent-first order: node i proposes rank ``ranks[i]`` under node ``parents[i]`` (-1: root)."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)


def rank_paths(widths: dict[tuple[int, ...], int]) -> list[tuple[int, ...]]:
    """Every node's rank path, breadth first (shallower first, then by path)."""
    paths, frontier = [], [()]
    while frontier:
        level = [(*path, r) for path in frontier for r in range(widths.get(path, 0))]
        paths += level
        frontier = level
    return paths


def make_template(name: str, max_tree_size: int | None = None, top_k: int | None = None) -> Template:
    """The named template's first ``max_tree_size`` nodes by (depth + summed rank); refuses ranks >= ``top_k``."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}")
    paths = sorted(rank_paths(TEMPLATES[name]), key=lambda path: len(path) + sum(path))
    if max_tree_size is not None:
        paths = paths[:max_tree_size]
    widest = max(path[-1] for path in paths) + 1
    if top_k is not None and widest > top_k:
        raise ValueError(f"template {name!r} uses successor rank {widest - 1}; it needs top_k >= {widest}, "
                         f"got {top_k}")
    index = {path: i for i, path in enumerate(paths)}
    parents = tuple(index[path[:-1]] if len(path) > 1 else -1 for path in paths)
    return Template(parents, tuple(path[-1] for path in paths), tuple(len(path) for path in paths))


def grow(root: int, successors: np.ndarray, known: np.ndarray, template: Template, gamma: int,
         stop: Collection[int] = ()) -> tuple[list[int], list[int]]:
    """The token tree the template grows from ``root``: (tokens, parents), parents[i] < i, -1 under the root.

    successors: (V, k) each token's successors, most likely first; known: (V,) whether that row was ever written.
    Nodes deeper than ``gamma`` and children of unknown or ``stop`` tokens are left out; a node whose token a sibling
    already carries is merged into that sibling (its template children then grow under it), so siblings are distinct.
    """
    tokens: list[int] = []
    parents: list[int] = []
    node_of: list[int | None] = []  # template node -> draft node (None: left out)
    child: dict[tuple[int, int], int] = {}  # (draft parent, token) -> draft node
    for parent, rank, depth in zip(template.parents, template.ranks, template.depths, strict=True):
        above = -1 if parent < 0 else node_of[parent]
        token_above = root if above == -1 else tokens[above] if above is not None else None
        if depth > gamma or token_above is None or not known[token_above] or token_above in stop:
            node_of.append(None)
            continue
        token = int(successors[token_above, rank])
        key = (above, token)
        if key not in child:
            child[key] = len(tokens)
            tokens.append(token)
            parents.append(above)
        node_of.append(child[key])
    return tokens, parents
