"""The n-gram pool: for each token, the most recent continuations of N - 1 tokens seen after it, and their trie."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class NgramPool:
    """Continuations by first token, most recent first, at most ``capacity`` per token."""

    capacity: int
    entries: dict[int, OrderedDict[tuple[int, ...], None]] = field(default_factory=dict)

    def add(self, gram: tuple[int, ...]) -> None:
        """Remember ``gram[1:]`` after ``gram[0]`` as the most recent continuation (evicting the oldest)."""
        tails = self.entries.setdefault(gram[0], OrderedDict())
        tail = tuple(gram[1:])
        tails[tail] = None
        tails.move_to_end(tail, last=False)
        while len(tails) > self.capacity:
            tails.popitem(last=True)

    def add_text(self, tokens: list[int], size: int, start: int = 0) -> None:
        """Add every n-gram of ``size`` tokens that begins at or after ``start`` and lies in ``tokens``."""
        for i in range(max(0, start), len(tokens) - size + 1):
            self.add(tuple(tokens[i : i + size]))

    def candidates(self, token: int, length: int, limit: int, stop: frozenset[int]) -> list[list[int]]:
        """Up to ``limit`` distinct continuations of ``token``, most recent first, cut to ``length`` tokens and just
        after a stop token."""
        paths: list[list[int]] = []
        for tail in self.entries.get(token, ()):
            path = _cut(list(tail[:length]), stop)
            if path and path not in paths:
                paths.append(path)
                if len(paths) == limit:
                    break
        return paths


def _cut(path: list[int], stop: frozenset[int]) -> list[int]:
    for i, token in enumerate(path):
        if token in stop:
            return path[: i + 1]
    return path


def trie(paths: Iterable[list[int]]) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the token tree merging ``paths`` (shared prefixes once; siblings in first-seen order)."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}
    for path in paths:
        node = -1
        for token in path:
            key = (node, token)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = children[key]
    return tokens, parents
