"""How deep a test reached: a drafter wrapper that records, per pass, the depth drafted, verified and accepted.

:class:`DepthRecorder` forwards the drafter protocol unchanged and counts, for every pass with a draft, the deepest
draft node, the deepest node the verifier tried and the accepted path's length; the last pass of a request (not
observed) is read back from the committed tokens, which identify the accepted path exactly.

It also records each generated token's **level**: the depth of the draft nodes the verifier tried when it chose
that token, 0 when none was tried. ``DepthStats.levels`` holds them per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specfamily.core.context import DecodeContext
from specfamily.core.policy import ConstantPolicy
from specfamily.core.types import Draft, VerifyOutcome


@dataclass
class DepthStats:
    """Pass counts by depth d (index d - 1): drafted to depth d, verified at depth d, accepted at depth d."""

    passes: int = 0  # passes with a non-empty draft
    trees: int = 0  # of those, drafts that were not a chain
    drafted: list[int] = field(default_factory=list)
    verified: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    requests: int = 0  # requests begun (a conformance sample is one request)
    requests_verified: list[int] = field(default_factory=list)  # d - 1: requests that verified a node d deep
    levels: list[list[int]] = field(default_factory=list)  # per request, per generated token: its level (0: none)
    _request_depth: int = field(default=0, repr=False)  # deepest verified in the current request

    def add(self, drafted: int, verified: int, accepted: int, tree: bool = False) -> None:
        self.passes += 1
        self.trees += tree
        for counts, depth in ((self.drafted, drafted), (self.verified, verified), (self.accepted, accepted)):
            _count_to(counts, depth)
        if verified > self._request_depth and self.requests:
            _count_to(self.requests_verified, verified, start=self._request_depth)
            self._request_depth = verified

    def begin_request(self) -> None:
        self.requests += 1
        self._request_depth = 0
        self.levels.append([])

    def set_levels(self, start: int, levels: list[int]) -> None:
        """The levels of the current request's generated tokens from index ``start`` on (tokens before it that no
        recorded pass decided, passes without a draft, are at level 0)."""
        row = self.levels[-1]
        row.extend([0] * (start + len(levels) - len(row)))
        row[start : start + len(levels)] = levels

    def finish_request(self, generated: int) -> None:
        """Pad or cut the current request's levels to the ``generated`` tokens it produced."""
        row = self.levels[-1]
        row.extend([0] * (generated - len(row)))
        del row[generated:]

    def tokens_at_level(self, level: int) -> int:
        """Generated tokens, over every request, decided at ``level``."""
        return sum(row.count(level) for row in self.levels)

    def share_verified(self, depth: int) -> float:
        """Share of the requests that verified a draft node ``depth`` deep (0 when none was recorded)."""
        if depth < 1 or not self.requests:
            return 0.0
        reached = self.requests_verified[depth - 1] if depth <= len(self.requests_verified) else 0
        return reached / self.requests

    @property
    def deepest_drafted(self) -> int:
        return len(self.drafted)

    @property
    def deepest_verified(self) -> int:
        """The deepest level at which the verifier tried a draft node in some pass."""
        return len(self.verified)

    @property
    def deepest_accepted(self) -> int:
        return len(self.accepted)

    def summary(self) -> str:
        shares = ", ".join(f"{reached / self.requests:.0%}" for reached in self.requests_verified) or "none"
        return (f"{self.passes} passes with a draft ({self.trees} trees); verified by depth {self.verified}, "
                f"accepted by depth {self.accepted}; share of {self.requests} requests verified at depth 1, 2, ...: "
                f"{shares}")


def _count_to(counts: list[int], depth: int, start: int = 0) -> None:
    """Add one to ``counts[start:depth]``, growing the list as needed."""
    counts.extend([0] * (depth - len(counts)))
    for d in range(start, depth):
        counts[d] += 1


def _children(parents: list[int]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def pass_levels(draft: Draft, path: list[int], committed: int) -> list[int]:
    """The level of each of the ``committed`` tokens of a pass that accepted ``path``: token j is decided at the
    root (j = 0) or at path[j - 1]; its level is that node's depth + 1 if it has children, else 0."""
    children = _children(draft.parents.tolist())
    levels = []
    for j in range(min(committed, len(path) + 1)):
        node = -1 if j == 0 else path[j - 1]
        levels.append(j + 1 if node in children else 0)
    return levels


def path_from_tokens(draft: Draft, committed: list[int]) -> list[int]:
    """The accepted path of ``draft`` given the tokens the pass committed (accepted tokens, then the target's)."""
    tokens, children = draft.tokens.tolist(), _children(draft.parents.tolist())
    path, node = [], -1
    for token in committed:
        match = next((c for c in children.get(node, []) if tokens[c] == token), None)
        if match is None:
            break
        path.append(match)
        node = match
    return path


class DepthRecorder:
    """Wraps a drafter (protocol forwarded unchanged) and records the depth of every verified draft in ``stats``.

    ``gamma``: drive the drafter at this constant draft length (tree depth), whatever its own policy would choose
    (the conformance kit tests proposals, not a policy's decision to make them). ``keep_drafts``: also keep every
    non-empty draft with the context it was proposed at, in ``drafts``.
    """

    def __init__(self, inner: Any, stats: DepthStats | None = None, gamma: int | None = None,
                 keep_drafts: bool = False) -> None:
        self.inner = inner
        self.stats = DepthStats() if stats is None else stats
        self.drafts: list[tuple[list[int], Draft]] | None = [] if keep_drafts else None  # (context, draft) per pass
        self._override = None if gamma is None else ConstantPolicy(gamma)
        self._ctx: DecodeContext | None = None
        self._pending: tuple[Draft, int] | None = None  # the last draft and the context length it was drafted at
        self._prompt = 0  # the current request's prompt length

    @property
    def needs_features(self) -> bool:
        return self.inner.needs_features

    @property
    def lossy(self) -> bool:
        return self.inner.lossy

    @property
    def policy(self):
        return self.inner.policy if self._override is None else self._override

    @property
    def config(self):
        """The wrapped drafter's options; none where ``gamma`` drives it: a length chosen, which the loops' load gate
        leaves alone (``core.batch_gate.gated``), as it leaves a drafter given a ``gamma``."""
        return getattr(self.inner, "config", None) if self._override is None else None

    def __getattr__(self, name: str):  # anything else (``accept``, options) is the wrapped drafter's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def begin(self, ctx: DecodeContext) -> None:
        self._ctx, self._pending, self._prompt = ctx, None, len(ctx.tokens)
        self.stats.begin_request()
        self.inner.begin(ctx)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        self._settle()
        draft = self.inner.propose(ctx, gamma)
        if len(draft):
            self._pending = (draft, len(ctx.tokens))
            if self.drafts is not None:
                self.drafts.append((list(ctx.tokens), draft))
        return draft

    def observe(self, outcome: VerifyOutcome) -> None:
        if self._pending is not None:
            draft, start = self._pending
            path = list(outcome.accepted_nodes)
            self._record(draft, path, start, len(path) + 1)
            self._pending = None
        self.inner.observe(outcome)

    def end(self) -> None:
        self._settle()
        if self._ctx is not None and self.stats.levels:
            self.stats.finish_request(len(self._ctx.tokens) - self._prompt)
        end = getattr(self.inner, "end", None)
        if callable(end):
            end()

    def _settle(self) -> None:
        """Record the pending draft's pass from the committed tokens (a pass the loop did not observe)."""
        if self._pending is None or self._ctx is None:
            return
        draft, start = self._pending
        self._pending = None
        committed = self._ctx.tokens[start:]
        if committed:
            self._record(draft, path_from_tokens(draft, committed), start, len(committed))

    def _record(self, draft: Draft, path: list[int], start: int, committed: int) -> None:
        """One verified pass drafted at context length ``start`` that kept ``committed`` tokens."""
        parents = draft.parents.tolist()
        tree = parents != list(range(-1, len(parents) - 1))
        depth: list[int] = []
        for parent in parents:
            depth.append(1 if parent < 0 else depth[parent] + 1)
        self.stats.add(max(depth, default=0), draft.verified_depth(path), len(path), tree)
        if self.stats.levels:
            self.stats.set_levels(start - self._prompt, pass_levels(draft, path, committed))
