"""A draft tree grown best first through the adjacency table by the target's own recycled probabilities.

Where the reference grows a static template, :func:`grow_scored` keeps the ``size`` nodes whose path probability
(the product of the recycled probabilities along it, each the target's softmax after the parent token when it last
saw it) is highest and at least ``threshold``. A child's product is never above its parent's, so best first adds a
parent before its children and any cut is a tree; a table that is unsure proposes little or nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection

import numpy as np


def grow_scored(root: int, successors: np.ndarray, scores: np.ndarray, known: np.ndarray, size: int, gamma: int,
                threshold: float, stop: Collection[int] = ()) -> tuple[list[int], list[int]]:
    """The token tree (tokens, parents), parents[i] < i, -1 under the root: the ``size`` most likely nodes at most
    ``gamma`` deep with path probability >= ``threshold``.

    successors, scores: (V, k) each token's successors, most likely first, and their recycled probabilities;
    known: (V,) whether that row was ever written. Unknown or ``stop`` tokens grow no children.
    """
    tokens: list[int] = []
    parents: list[int] = []
    heap: list[tuple[float, int, int, int, int]] = []  # (-p, tie, parent node, token, depth)
    tie = 0

    def push(token_above: int, node: int, p_above: float, depth: int) -> None:
        nonlocal tie
        if depth > gamma or not known[token_above] or token_above in stop:
            return
        for token, q in zip(successors[token_above].tolist(), scores[token_above].tolist(), strict=True):
            p = p_above * q
            if p >= threshold and p > 0.0:
                heapq.heappush(heap, (-p, tie, node, token, depth))
                tie += 1

    push(root, -1, 1.0, 1)
    while heap and len(tokens) < size:
        p, _, parent, token, depth = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        push(token, len(tokens) - 1, -p, depth + 1)
    return tokens, parents
