"""REST's retrieval, pure: the continuations that followed a match, and a token tree of their most frequent prefixes."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from specfamily.drafters.rest.datastore import SEPARATOR


def continuations(tokens: np.ndarray, positions: np.ndarray, span: int, length: int,
                  stop: Collection[int] = ()) -> list[list[int]]:
    """The ``length`` tokens after each match of ``span`` tokens at ``positions``, each cut at its sequence's end and
    just after its first ``stop`` token (an end of text: nothing after it is drafted)."""
    if len(positions) == 0 or length <= 0:
        return []
    index = positions[:, None] + span + np.arange(length)[None, :]  # (m, length)
    inside = index < len(tokens)
    rows = np.where(inside, np.asarray(tokens)[np.minimum(index, len(tokens) - 1)], SEPARATOR)  # (m, length)
    ended = np.cumsum(rows == SEPARATOR, axis=1) > 0
    if stop:
        stops = np.isin(rows, np.fromiter(stop, dtype=rows.dtype))
        ended |= (np.cumsum(stops, axis=1) - stops) > 0  # past the first stop token
    rows = np.where(ended, SEPARATOR, rows)
    return [[int(t) for t in row if t != SEPARATOR] for row in rows.tolist()]


def frequent_tree(paths: list[list[int]], max_nodes: int) -> tuple[list[int], list[int]]:
    """The ``max_nodes`` prefixes of ``paths`` that most paths share, as a token tree (tokens, parents), parents
    before children, siblings by descending count. A prefix is counted once per path that starts with it; a parent's
    count is at least its child's, and ties go to the shorter prefix, then the smaller tokens, so the chosen prefixes
    form a tree. Counted per depth over the paths as one array (a depth's prefixes beyond its own ``max_nodes`` best
    cannot be among the best overall)."""
    width = max((len(path) for path in paths), default=0)
    if width == 0 or max_nodes <= 0:
        return [], []
    rows = np.full((len(paths), width), -1, dtype=np.int64)  # (m, width), -1 past each path's end
    lengths = np.array([len(path) for path in paths])
    for i, path in enumerate(paths):
        rows[i, : len(path)] = path
    candidates: list[tuple[int, int, tuple[int, ...]]] = []  # (-count, depth, prefix)
    for depth in range(1, width + 1):
        prefixes, counts = np.unique(rows[lengths >= depth, :depth], axis=0, return_counts=True)  # lexicographic
        best = np.lexsort((np.arange(len(counts)), -counts))[:max_nodes]
        candidates += [(-int(counts[j]), depth, tuple(prefixes[j].tolist())) for j in best]
    chosen = sorted(candidates)[:max_nodes]
    chosen.sort(key=lambda item: (item[1], item[0], item[2]))
    index: dict[tuple[int, ...], int] = {}
    tokens, parents = [], []
    for _, _, prefix in chosen:
        index[prefix] = len(tokens)
        tokens.append(prefix[-1])
        parents.append(index[prefix[:-1]] if len(prefix) > 1 else -1)
    return tokens, parents
