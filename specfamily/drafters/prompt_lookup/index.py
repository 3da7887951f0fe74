"""An incremental n-gram index over a growing token sequence, and the trie that merges its proposals.

For every n in [min_ngram, max_ngram] the index maps an n-gram to the continuation start of its latest occurrence
and links each continuation start to the previous occurrence of the same n-gram: appending a token is one dict
update per n, each earlier occurrence one lookup, nothing is rescanned. Continuations are copied as in LZ77: one that
runs into the end of the context goes on copying its own proposal ("a b a b" proposes "a b a b ...").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field

NO_OCCURRENCE = -1
WALK_PER_BRANCH = 4  # older occurrences visited per wanted branch and n before giving up on more branches


@dataclass
class NgramIndex:
    """Occurrences of every n-gram (min_ngram <= n <= max_ngram) in ``tokens``, updated by :meth:`extend`."""

    min_ngram: int = 1
    max_ngram: int = 3
    tokens: list[int] = field(default_factory=list)
    matched: int = field(default=0, init=False)  # the n-gram length behind the latest proposal's best path (0: none)
    _latest: dict[int, dict[tuple[int, ...], int]] = field(init=False, repr=False)
    _previous: dict[int, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.min_ngram, bool) or not isinstance(self.min_ngram, int) or self.min_ngram < 1:
            raise ValueError(f"min_ngram must be an integer >= 1, got {self.min_ngram!r}")
        if isinstance(self.max_ngram, bool) or not isinstance(self.max_ngram, int) or self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram must be an integer >= min_ngram ({self.min_ngram}), got {self.max_ngram!r}")
        tokens, self.tokens = list(self.tokens), []
        sizes = range(self.min_ngram, self.max_ngram + 1)
        self._latest = {n: {} for n in sizes}
        self._previous = {n: [NO_OCCURRENCE] for n in sizes}  # indexed by continuation start 0..len(tokens)
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new_tokens: Iterable[int]) -> None:
        """Append committed tokens and index the n-grams that end at each of them."""
        tokens = self.tokens
        for token in new_tokens:
            tokens.append(token)
            start = len(tokens)
            for n, latest in self._latest.items():
                previous = self._previous[n]
                if start < n:
                    previous.append(NO_OCCURRENCE)
                    continue
                key = tuple(tokens[start - n : start])
                previous.append(latest.get(key, NO_OCCURRENCE))
                latest[key] = start

    def occurrences(self, n: int) -> Iterator[int]:
        """Continuation starts of earlier occurrences of the last ``n`` tokens, most recent first."""
        if n not in self._latest:
            raise ValueError(f"n must be in [{self.min_ngram}, {self.max_ngram}], got {n!r}")
        length = len(self.tokens)
        if length < n:
            return
        previous = self._previous[n]
        start = previous[length]  # the suffix itself is the latest occurrence, with nothing after it
        while start != NO_OCCURRENCE:
            yield start
            start = previous[start]

    def continuation(self, start: int, length: int, stop: Collection[int] = ()) -> list[int]:
        """Up to ``length`` tokens copied from ``start`` on (LZ77-style past the end), cut just after a stop token."""
        if not 0 <= start < len(self.tokens):
            raise ValueError(f"start must be in [0, {len(self.tokens)}), got {start!r}")
        tokens, out = self.tokens, []
        end = len(tokens)
        for k in range(length):
            position = start + k
            token = tokens[position] if position < end else out[position - end]
            out.append(token)
            if token in stop:
                break
        return out

    def propose(self, gamma: int, branches: int = 1, stop: Collection[int] = ()) -> list[list[int]]:
        """Up to ``branches`` continuations of up to ``gamma`` tokens, best first, each adding a new trie path.

        Longer matching n-grams come first; for the same n, more recent occurrences first. A
        continuation that is a prefix of (or equal to) one already chosen is skipped; at most
        ``WALK_PER_BRANCH * branches`` occurrences are examined per n. No match: []. The best path's n is kept in
        ``matched`` (0 without one).
        """
        self.matched = 0
        if gamma < 1 or branches < 1:
            return []
        chosen: list[list[int]] = []
        seen_starts: set[int] = set()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            budget = WALK_PER_BRANCH * branches
            for start in self.occurrences(n):
                if start in seen_starts:  # already proposed through a longer n-gram
                    continue
                seen_starts.add(start)
                candidate = self.continuation(start, gamma, stop)
                if not any(other[: len(candidate)] == candidate for other in chosen):  # not a prefix of one chosen
                    chosen.append(candidate)
                    self.matched = self.matched or n
                    if len(chosen) == branches:
                        return chosen
                budget -= 1
                if budget == 0:
                    break
        return chosen


def build_trie(paths: Iterable[list[int]]) -> tuple[list[int], list[int]]:
    """Merge token paths into a trie: (tokens, parents), parents[i] < i, -1 for children of the root.

    Nodes are numbered as they are created, so siblings keep the order of the paths that created
    them and shared prefixes appear once (deterministic siblings carry distinct tokens).
    """
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for path in paths:
        node = -1
        for token in path:
            child = children.get((node, token))
            if child is None:
                child = len(tokens)
                children[(node, token)] = child
                tokens.append(token)
                parents.append(node)
            node = child
    return tokens, parents
