"""A compact suffix index: a generalized suffix automaton with occurrence counts for substrings up to ``max_depth``.

At most two states and three transitions per token, answering what speculation needs: the count of any substring of
at most ``max_depth`` tokens and the counts of its one-token continuations. A *node* is a state with one length of
its strings, packed as ``state << 8 | length`` (``ROOT`` = 0), so the ``max_depth`` cap applies as in the trie.

Appending a token extends the automaton and adds the new end position to the states of the sequence's suffixes of
up to ``max_depth`` tokens (:class:`Sequence` keeps the longest, so the cost never depends on the history's length).
Removing a sequence takes its positions off the same states; a state at count 0 is absent, and
:meth:`SuffixIndex.compacted` rebuilds the automaton from the live sequences.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from specfamily.drafters.suffix.tree import check_depth

ROOT = 0
NONE = -1
LENGTH_BITS = 8  # node = state << LENGTH_BITS | length; max_depth <= 255
TOKEN_BITS = 32  # transition key: state << TOKEN_BITS | token


def node_of(state: int, length: int) -> int:
    return state << LENGTH_BITS | length


@dataclass
class SuffixIndex:
    """Occurrence counts of every substring (up to ``max_depth`` tokens) of the sequences inserted."""

    max_depth: int = 64
    length: array = field(default_factory=lambda: array("i", [0]))  # longest string of each state
    link: array = field(default_factory=lambda: array("i", [NONE]))  # suffix link
    count: array = field(default_factory=lambda: array("q", [0]))  # occurrences (kept for states of short strings)
    label: array = field(default_factory=lambda: array("q", [NONE]))  # the token every string of the state ends in
    recent: array = field(default_factory=lambda: array("q", [NONE]))  # the latest position its strings end at
    first: array = field(default_factory=lambda: array("i", [NONE]))  # first outgoing transition (edge id)
    edge_token: array = field(default_factory=lambda: array("q"))
    edge_next: array = field(default_factory=lambda: array("i"))
    edges: dict[int, int] = field(default_factory=dict)  # state << TOKEN_BITS | token -> target state
    visits: int = 0  # count updates made by appends and removals (the cost tests count these)
    clock: int = 0  # positions appended so far, over every sequence (``recent`` stamps)

    def __post_init__(self) -> None:
        check_depth(self.max_depth)

    # --- the protocol speculate.py reads (shared with tree.SuffixTrie) ---------------------------------------

    def count_of(self, node: int) -> int:
        return self.count[node >> LENGTH_BITS]

    def depth_of(self, node: int) -> int:
        return node & ((1 << LENGTH_BITS) - 1)

    def token_of(self, node: int) -> int:
        return self.label[node >> LENGTH_BITS]

    def recent_of(self, node: int) -> int:
        """The position (over every sequence appended) of the latest occurrence's end: larger is more recent."""
        return self.recent[node >> LENGTH_BITS]

    def children(self, node: int) -> Iterator[int]:
        """The nodes one token longer than ``node`` that occur (count > 0); none at ``max_depth``."""
        depth = node & ((1 << LENGTH_BITS) - 1)
        if depth >= self.max_depth:
            return
        state, count, edges = node >> LENGTH_BITS, self.count, self.edges
        edge = self.first[state]
        while edge != NONE:
            target = edges[state << TOKEN_BITS | self.edge_token[edge]]
            if count[target] > 0:
                yield target << LENGTH_BITS | (depth + 1)
            edge = self.edge_next[edge]

    def has_children(self, node: int) -> bool:
        if self.first[node >> LENGTH_BITS] == NONE:
            return False
        return next(self.children(node), None) is not None

    # --- structure ------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """States that hold live strings, the root excluded."""
        return sum(1 for c in self.count[1:] if c > 0)

    def step(self, state: int, token: int) -> int:
        """The state reached from ``state`` by ``token`` (NONE when no live string continues so)."""
        target = self.edges.get(state << TOKEN_BITS | token, NONE)
        return target if target != NONE and self.count[target] > 0 else NONE

    def find(self, tokens: Iterable[int]) -> int:
        """The node of ``tokens`` (NONE when it does not occur or is longer than ``max_depth``)."""
        state, depth = ROOT, 0
        for token in tokens:
            state, depth = self.step(state, token), depth + 1
            if state == NONE or depth > self.max_depth:
                return NONE
        return node_of(state, depth)

    def nbytes(self) -> int:
        """Approximate memory of the arrays and the transition dict (slots, int keys and values)."""
        arrays = sum(a.itemsize * len(a) for a in (self.length, self.link, self.count, self.label, self.recent,
                                                    self.first, self.edge_token, self.edge_next))
        return arrays + len(self.edges) * (8 * 3 + 36 + 28) * 3 // 2

    def _new_state(self, length: int, label: int, link: int, count: int, recent: int = NONE) -> int:
        for column, value in ((self.length, length), (self.link, link), (self.count, count), (self.label, label),
                              (self.recent, recent), (self.first, NONE)):
            column.append(value)
        return len(self.length) - 1

    def _set_edge(self, state: int, token: int, target: int) -> None:
        key = state << TOKEN_BITS | token
        if key not in self.edges:
            self.edge_token.append(token)
            self.edge_next.append(self.first[state])
            self.first[state] = len(self.edge_token) - 1
        self.edges[key] = target

    def _clone(self, state: int, length: int) -> int:
        """A copy of ``state`` holding its strings of up to ``length`` tokens (same endings, so same count)."""
        clone = self._new_state(length, self.label[state], self.link[state], self.count[state], self.recent[state])
        edge = self.first[state]
        while edge != NONE:
            token = self.edge_token[edge]
            self._set_edge(clone, token, self.edges[state << TOKEN_BITS | token])
            edge = self.edge_next[edge]
        self.link[state] = clone
        return clone

    def _redirect(self, state: int, token: int, old: int, new: int) -> None:
        """Point ``token`` transitions from ``state`` and its suffix-link ancestors that reach ``old`` at ``new``."""
        edges = self.edges
        while state != NONE and edges.get(state << TOKEN_BITS | token) == old:
            edges[state << TOKEN_BITS | token] = new
            state = self.link[state]

    def extend(self, last: int, token: int) -> int:
        """The state of (the string of ``last``) + ``token``, adding it to the automaton (online construction of
        a generalized suffix automaton); counts are not touched (see :class:`Sequence`)."""
        target = self.edges.get(last << TOKEN_BITS | token, NONE)
        if target != NONE:  # this string occurred before (in another sequence)
            if self.length[target] == self.length[last] + 1:
                return target
            clone = self._clone(target, self.length[last] + 1)
            self._redirect(last, token, target, clone)
            return clone
        current = self._new_state(self.length[last] + 1, token, ROOT, 0)
        state = last
        while state != NONE and (state << TOKEN_BITS | token) not in self.edges:
            self._set_edge(state, token, current)
            state = self.link[state]
        if state != NONE:
            target = self.edges[state << TOKEN_BITS | token]
            if self.length[target] == self.length[state] + 1:
                self.link[current] = target
            else:
                clone = self._clone(target, self.length[state] + 1)
                self._redirect(state, token, target, clone)
                self.link[current] = clone
        return current

    def shorten(self, state: int, length: int, limit: int) -> tuple[int, int]:
        """(state, length) of the suffix of at most ``limit`` tokens of a string of ``length`` tokens in ``state``."""
        if length <= limit:
            return state, length
        while self.length[self.link[state]] >= limit:
            state = self.link[state]
        return state, limit

    def add_count(self, state: int, delta: int) -> None:
        """Add ``delta`` to the count of ``state`` and of every state on its suffix-link path."""
        count = self.count
        while state != NONE:
            count[state] += delta
            self.visits += 1
            state = self.link[state]

    def add_occurrence(self, state: int) -> None:
        """Count a new end position in ``state`` and every state on its suffix-link path, stamped as the latest."""
        count, recent, clock = self.count, self.recent, self.clock
        while state != NONE:
            count[state] += 1
            recent[state] = clock
            self.visits += 1
            state = self.link[state]
        self.clock += 1

    def insert(self, tokens: Iterable[int]) -> None:
        """Count every substring (up to max_depth tokens) of one sequence."""
        Sequence(self).extend(tokens)

    def remove(self, tokens: Iterable[int]) -> None:
        """Undo :meth:`insert` of the same sequence (its strings' counts go down; states stay until compacted)."""
        state, length, states = ROOT, 0, []
        for token in tokens:  # find every position's state first: nothing changes for a sequence never inserted
            target = self.edges.get(state << TOKEN_BITS | token, NONE)  # state's strings may be max_depth long
            if target != NONE:
                state, length = self.shorten(target, length + 1, self.max_depth)
            if target == NONE or self.count[state] <= 0:
                raise ValueError("cannot remove a sequence that was not inserted")
            states.append(state)
        for state in states:
            self.add_count(state, -1)

    def suffix_nodes(self, state: int, length: int, longest: int, depth: int) -> list[int]:
        """The nodes to grow speculations from for a matched suffix of ``length`` tokens in ``state``: for each
        state on its suffix-link path (strings of ``length[link] + 1`` .. its own, at most ``longest``), the
        longest string that leaves room for ``depth`` levels below it (the others make a subset of its tree), and
        each longer one (cut by ``max_depth``); shortest first."""
        state, length = self.shorten(state, length, longest)
        out: list[int] = []
        while state != ROOT:
            shortest = self.length[self.link[state]] + 1
            roomy = min(length, self.max_depth - depth)
            lengths = range(max(shortest, roomy + 1), length + 1)
            out.extend(node_of(state, n) for n in reversed(lengths))
            if roomy >= shortest:
                out.append(node_of(state, roomy))
            state = self.link[state]
            length = self.length[state]
        return out[::-1]


@dataclass
class Sequence:
    """Appends tokens to one sequence of an index: ``last`` is the state of the whole sequence (for the
    construction), ``state``/``length`` the state and length of its suffix of up to ``max_depth`` tokens (whose
    suffix-link path holds every state the new position is counted in)."""

    index: SuffixIndex
    last: int = ROOT
    state: int = ROOT
    length: int = 0

    def append(self, token: int) -> None:
        index = self.index
        self.last = index.extend(self.last, token)
        target = index.edges[self.state << TOKEN_BITS | token]
        self.state, self.length = index.shorten(target, self.length + 1, index.max_depth)
        index.add_occurrence(self.state)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def suffix_nodes(self, depth: int) -> list[int]:
        """Nodes of this sequence's suffixes of 1 .. max_depth - 1 tokens to speculate from (see
        :meth:`SuffixIndex.suffix_nodes`)."""
        return self.index.suffix_nodes(self.state, self.length, self.index.max_depth - 1, depth)


@dataclass
class Matcher:
    """The longest suffix (at most ``max_depth - 1`` tokens) of a growing context that occurs in ``index``."""

    index: SuffixIndex
    state: int = ROOT
    length: int = 0

    def append(self, token: int) -> None:
        index, state, length = self.index, self.state, self.length
        while True:
            target = index.step(state, token)
            if target != NONE:
                self.state, self.length = index.shorten(target, length + 1, index.max_depth - 1)
                return
            if state == ROOT:
                self.state, self.length = ROOT, 0
                return
            state = index.link[state]
            length = index.length[state]

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def suffix_nodes(self, depth: int) -> list[int]:
        return self.index.suffix_nodes(self.state, self.length, self.index.max_depth - 1, depth)
