"""REST's retrieval, pure: the continuations that followed a match, and a token tree of their most frequent prefixes."""

from __future__ import annotations

from collections import Counter

import numpy as np

from specfamily.drafters.rest.datastore import SEPARATOR


def continuations(tokens: np.ndarray, positions: np.ndarray, span: int, length: int) -> list[list[int]]:
    """The ``length`` tokens after each match of ``span`` tokens at ``positions``, each cut at its sequence's end."""
    if len(positions) == 0 or length <= 0:
        return []
    index = positions[:, None] + span + np.arange(length)[None, :]  # (m, length)
    inside = index < len(tokens)
    rows = np.where(inside, np.asarray(tokens)[np.minimum(index, len(tokens) - 1)], SEPARATOR)  # (m, length)
    ended = np.cumsum(rows == SEPARATOR, axis=1) > 0
    rows = np.where(ended, SEPARATOR, rows)
    return [[int(t) for t in row if t != SEPARATOR] for row in rows.tolist()]


def frequent_tree(paths: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """The ``max_nodes`` prefixes of ``paths`` that most paths share, as a token tree (tokens, parents), parents
    before children, siblings by descending count. A prefix is counted once per path that starts with it; a parent's
    count is at least its child's, and ties go to the shorter prefix, so the chosen prefixes form a tree."""
    counts: Counter[tuple[int, ...]] = Counter()
    for path in paths:
        for depth in range(1, len(path) + 1):
            counts[tuple(path[:depth])] += 1
    chosen = sorted(counts.items(), key=lambda item: (-item[1], len(item[0]), item[0]))[:max_nodes]
    chosen.sort(key=lambda item: (len(item[0]), -item[1], item[0]))
    index: dict[tuple[int, ...], int] = {}
    tokens, parents = [], []
    for prefix, _ in chosen:
        index[prefix] = len(tokens)
        tokens.append(prefix[-1])
        parents.append(index[prefix[:-1]] if len(prefix) > 1 else -1)
    return tokens, parents
