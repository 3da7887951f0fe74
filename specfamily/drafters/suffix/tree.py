"""A suffix trie of bounded depth with occurrence counts, updated in O(max_depth) per appended token: the plain
reference the drafter's :mod:`specfamily.drafters.suffix.automaton` is tested against and measured beside.

Every substring of length <= ``max_depth`` of the inserted sequences is a path from the root, a node's ``count``
how many times its string occurs. A :class:`Cursor` holds the nodes of a sequence's last ``max_depth - 1`` suffixes,
so appending a token costs the same however long the history; suffix links let a :class:`Matcher` track the longest
suffix of a growing context that the trie holds. Nodes live in flat arrays (ids are ints, the root is 0); removing
a sequence replays its insertion with counts decremented, and nodes at count 0 are unlinked and their ids reused.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

ROOT = 0
NONE = -1
TOKEN_BITS = 32  # edge key: node << TOKEN_BITS | token


def check_depth(max_depth: object) -> int:
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 2 <= max_depth <= 255:
        raise ValueError(f"max_depth must be an integer in [2, 255], got {max_depth!r}")
    return max_depth


def check_tokens(tokens: Iterable[object], what: str = "tokens") -> list[int]:
    """The tokens as a list of ints in [0, 2**32), or a ValueError naming the first bad one."""
    out = list(tokens)
    for i, token in enumerate(out):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 1 << TOKEN_BITS:
            raise ValueError(f"{what}[{i}] must be a token id in [0, 2**32), got {token!r}")
    return out


@dataclass
class SuffixTrie:
    """Counts of every substring (up to ``max_depth`` tokens) of the sequences inserted."""

    max_depth: int = 64
    count: array = field(default_factory=lambda: array("q", [0]))
    depth: array = field(default_factory=lambda: array("B", [0]))
    link: array = field(default_factory=lambda: array("i", [NONE]))
    parent: array = field(default_factory=lambda: array("i", [NONE]))
    token: array = field(default_factory=lambda: array("q", [NONE]))
    first: array = field(default_factory=lambda: array("i", [NONE]))  # first child
    sibling: array = field(default_factory=lambda: array("i", [NONE]))  # next sibling
    edges: dict[int, int] = field(default_factory=dict)
    free: list[int] = field(default_factory=list)
    visits: int = 0  # node updates made by inserts and removals (the cost tests count these)

    def __post_init__(self) -> None:
        check_depth(self.max_depth)

    def __len__(self) -> int:
        """Live nodes, the root excluded."""
        return len(self.count) - 1 - len(self.free)

    def count_of(self, node: int) -> int:
        return self.count[node]

    def depth_of(self, node: int) -> int:
        return self.depth[node]

    def token_of(self, node: int) -> int:
        return self.token[node]

    def child(self, node: int, token: int) -> int:
        return self.edges.get(node << TOKEN_BITS | token, NONE)

    def children(self, node: int) -> Iterator[int]:
        child = self.first[node]
        while child != NONE:
            yield child
            child = self.sibling[child]

    def has_children(self, node: int) -> bool:
        return self.first[node] != NONE

    def string(self, node: int) -> list[int]:
        """The tokens on the path from the root to ``node``."""
        out = []
        while node != ROOT:
            out.append(self.token[node])
            node = self.parent[node]
        return out[::-1]

    def find(self, tokens: Iterable[int]) -> int:
        """The node of ``tokens`` (NONE when the trie does not hold that string)."""
        node = ROOT
        for token in tokens:
            node = self.child(node, token)
            if node == NONE:
                return NONE
        return node

    def nbytes(self) -> int:
        """Approximate memory of the arrays and the edge dict (dict slots, int keys and values)."""
        arrays = sum(a.itemsize * len(a) for a in (self.count, self.depth, self.link, self.parent, self.token,
                                                    self.first, self.sibling))
        return arrays + len(self.edges) * (8 * 3 + 32 + 28) * 3 // 2

    def add_child(self, node: int, token: int) -> int:
        """A new child of ``node`` for ``token`` with count 0 (its suffix link is set by the caller)."""
        if self.free:
            child = self.free.pop()
            self.count[child], self.depth[child], self.token[child] = 0, self.depth[node] + 1, token
            self.parent[child] = node
            self.first[child], self.sibling[child], self.link[child] = NONE, self.first[node], NONE
        else:
            child = len(self.count)
            values = ((self.count, 0), (self.depth, self.depth[node] + 1), (self.link, NONE), (self.parent, node),
                      (self.token, token), (self.first, NONE), (self.sibling, self.first[node]))
            for column, value in values:
                column.append(value)
        self.first[node] = child
        self.edges[node << TOKEN_BITS | token] = child
        return child

    def drop_child(self, child: int) -> None:
        """Unlink ``child`` (count 0) from its parent and free its id."""
        node = self.parent[child]
        del self.edges[node << TOKEN_BITS | self.token[child]]
        if self.first[node] == child:
            self.first[node] = self.sibling[child]
        else:
            previous = self.first[node]
            while self.sibling[previous] != child:
                previous = self.sibling[previous]
            self.sibling[previous] = self.sibling[child]
        self.free.append(child)

    def insert(self, tokens: Iterable[int]) -> None:
        """Count every substring (up to max_depth tokens) of one sequence."""
        cursor = Cursor(self)
        cursor.extend(tokens)

    def remove(self, tokens: Iterable[int]) -> None:
        """Undo :meth:`insert` of the same sequence."""
        active = [ROOT]
        for token in tokens:
            nxt = [ROOT]
            for node in active:
                child = self.child(node, token)
                if child == NONE:
                    raise ValueError("cannot remove a sequence that was not inserted")
                self.visits += 1
                self.count[child] -= 1
                if self.count[child] == 0:  # its descendants reach 0 too, through this same chain
                    self.drop_child(child)
                if self.depth[child] < self.max_depth:
                    nxt.append(child)
            active = nxt


@dataclass
class Cursor:
    """Appends tokens to one sequence in a trie: ``active`` holds the nodes of its suffixes that can still grow,
    the root first and then by increasing depth (lengths 1 .. max_depth - 1)."""

    trie: SuffixTrie
    active: list[int] = field(default_factory=lambda: [ROOT])
    length: int = 0

    def append(self, token: int) -> None:
        trie = self.trie
        children = []
        for node in self.active:
            child = trie.child(node, token)
            if child == NONE:
                child = trie.add_child(node, token)
            trie.count[child] += 1
            trie.visits += 1
            children.append(child)
        trie.link[children[0]] = ROOT  # the child of the root: its string minus its first token is empty
        for shorter, child in zip(children, children[1:], strict=False):
            trie.link[child] = shorter
        self.active = [ROOT, *(c for c in children if trie.depth[c] < trie.max_depth)]
        self.length += 1

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def suffixes(self) -> list[int]:
        """The nodes of this sequence's suffixes of 1 .. max_depth - 1 tokens, shortest first."""
        return self.active[1:]

    def longest_with_continuation(self) -> int:
        """The deepest suffix node of this sequence that has a child (an earlier occurrence went on); ROOT if none."""
        trie = self.trie
        for node in reversed(self.active):
            if trie.has_children(node):
                return node
        return ROOT


@dataclass
class Matcher:
    """The longest suffix of a growing context that is a node of ``trie`` (Aho-Corasick over suffix links)."""

    trie: SuffixTrie
    node: int = ROOT

    def append(self, token: int) -> None:
        trie, node = self.trie, self.node
        while True:
            child = trie.child(node, token)
            if child != NONE:
                self.node = child
                return
            if node == ROOT:
                self.node = ROOT
                return
            node = trie.link[node]

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def suffixes(self) -> list[int]:
        """The nodes of every suffix of the context the trie holds, shortest first (along the suffix links)."""
        trie, node, out = self.trie, self.node, []
        while node != ROOT:
            out.append(node)
            node = trie.link[node]
        return out[::-1]

    def longest_with_continuation(self) -> int:
        """The deepest suffix of the context whose node has a child; ROOT if none."""
        trie, node = self.trie, self.node
        while node != ROOT and not trie.has_children(node):
            node = trie.link[node]
        return node
