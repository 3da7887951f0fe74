"""A copy drafter's acceptance by its evidence, learned from every proposal, drafted or not.

Prompt lookup and suffix report what they matched to propose (``Draft.evidence``: the n-gram's or the suffix's
length), and a draft copied behind a long match is accepted far more often than one behind a single token. The
batched plan valued both alike, from counts over the passes it drafted: it saw only the drafts it chose, and a pooled
depth-1 acceptance of ~0.35 declined most of them (docs/batching-log.md, session 27).

A deterministic proposal's acceptance needs no verification: once the request's text has gone past it, the deepest
path of its tree that the text continues is what drafting it whole would have had accepted (under greedy decoding
exactly; under sampling a token equals a one-hot draft's token with the probability the verifier accepts it). So every
proposal the lookahead path sees (a full-length one, asked before the plan) is held until its request's text decides
it, then counted in its evidence's bucket (:func:`bucket`) as the request's own (:class:`Evidence`) and the batch's
(:func:`kept_evidence`: kept on the target per drafter class, across calls). Each level is counted as soon as the text
decides it (:class:`Held`), not once the whole proposal is decided: a proposal missed at depth 1 is decided by the next
token and one accepted deep only tokens later, so counting whole proposals counted the misses first, and the
acceptances still pending at any time pulled every estimate below what the drafts were accepted at
(docs/batching-log.md, session 29). A request's text copies itself more as it grows, so its proposals are accepted more
the later they come: counts are also kept by the proposal's position in its text (:func:`band`). A draft's per-depth
acceptance is its request's counts in its bucket at its band over the batch's there, over the batch's in that bucket,
over the batch's pooled drafted passes (:meth:`Evidence.alpha`); a proposal with no evidence (0) is valued as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specfamily.core.batch_kept import kept_record
from specfamily.core.batch_tally import Tally
from specfamily.core.types import Draft

__all__ = ["Evidence", "Held", "Proposal", "band", "bucket", "kept_evidence", "resolve"]

_BATCH_WEIGHT, _OWN_WEIGHT = 2.0, 4.0  # passes the pooled prior is worth to a bucket, the bucket to a request's own


def bucket(evidence: int) -> int:
    """The bucket of a match length: 1, 2 and 3 apart (prompt lookup's n-grams), then one a doubling (4-7, 8-15, ...:
    suffix's matches run to its ``max_depth``); 0 for none."""
    return evidence if evidence < 4 else evidence.bit_length() + 1


def band(at: int) -> int:
    """The band of a proposal made after ``at`` new tokens of its request: one a doubling (0, 1, 2-3, 4-7, ...)."""
    return at.bit_length()


@dataclass(frozen=True)
class Proposal:
    """A proposal held until its request's text decides it: its tree, the new tokens it followed, its bucket."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    at: int
    bucket: int

    @classmethod
    def of(cls, draft: Draft, at: int) -> Proposal:
        return cls(tuple(draft.tokens.tolist()), tuple(draft.parents.tolist()), at, bucket(draft.evidence))


@dataclass
class Held:
    """A held proposal and how far its request's text has decided it: the node its path reached (-1: none), the
    levels counted."""

    proposal: Proposal
    node: int = -1
    depth: int = 0

    def advance(self, text: Sequence[int]) -> tuple[list[bool], bool]:
        """(each level ``text`` newly decides, in order: accepted or not; whether the proposal is decided whole: its
        path left the tree or reached a leaf)."""
        future, tokens, parents = text[self.proposal.at :], self.proposal.tokens, self.proposal.parents
        levels = []
        while True:
            children = [i for i, p in enumerate(parents) if p == self.node]
            if not children:
                return levels, True
            if self.depth >= len(future):
                return levels, False
            child = next((i for i in children if tokens[i] == future[self.depth]), None)
            levels.append(child is not None)
            if child is None:
                return levels, True
            self.node, self.depth = child, self.depth + 1


def resolve(proposal: Proposal, text: Sequence[int]) -> tuple[int, int] | None:
    """(levels a verifier would have tried, levels accepted) for ``proposal`` drafted whole, once ``text`` (the
    request's new tokens) decides it: its path has left the tree or reached a leaf; None while the text is too short."""
    levels, done = Held(proposal).advance(text)
    return (len(levels), sum(levels)) if done else None


def kept_evidence(target, drafter) -> dict:
    """The batch's tallies by bucket and by (bucket, band) for ``drafter``'s class on ``target`` (beside the pooled
    tally, ``kept_tally``), kept across ``generate_batch`` calls; a target without that record: the run's own."""
    return kept_record(target, drafter, "evidence", dict)


@dataclass
class Evidence:
    """One batched call's proposals awaiting their text, and the tallies they teach: the batch's by bucket
    (``kept``), each request's by bucket (``own``, keyed by request index)."""

    kept: dict = field(default_factory=dict)  # bucket, and (bucket, band) -> the batch's tally
    own: dict[tuple[int, int, int], Tally] = field(default_factory=dict)  # (request, bucket, band) -> its tally
    pending: dict[int, list[Held]] = field(default_factory=dict)

    def learn(self, request: int, text: Sequence[int]) -> None:
        """Count every level of ``request``'s held proposals that its ``text`` now decides (:meth:`Held.advance`);
        a proposal decided whole is let go."""
        held = self.pending.get(request)
        if not held:
            return
        left = []
        for each in held:
            start = each.depth
            levels, done = each.advance(text)
            if levels:
                key, at = each.proposal.bucket, band(each.proposal.at)
                tallies = [self.kept.setdefault(k, Tally()) for k in (key, (key, at))]
                tallies.append(self.own.setdefault((request, key, at), Tally()))
                for depth, accepted in enumerate(levels, start=start + 1):
                    for tally in tallies:
                        tally.add_level(depth, accepted)
            if not done:
                left.append(each)
        self.pending[request] = left

    def hold(self, request: int, draft: Draft, at: int) -> None:
        """Hold ``request``'s proposal ``draft`` (deterministic, with evidence), made after ``at`` new tokens."""
        if len(draft) and draft.evidence > 0 and draft.q is None:
            self.pending.setdefault(request, []).append(Held(Proposal.of(draft, at)))

    def alpha(self, request: int, evidence: int, pooled: Sequence[float], at: int | None = None) -> list[float] | None:
        """Per-depth acceptance of ``request``'s draft with ``evidence``, made after ``at`` new tokens: its own counts
        in the bucket at that :func:`band` over the batch's there (worth ``_OWN_WEIGHT`` passes), those over the
        batch's in the bucket (worth ``_BATCH_WEIGHT``), those over ``pooled`` (worth ``_BATCH_WEIGHT``); ``at``
        None: the batch's in the bucket alone. None without evidence."""
        return None if evidence <= 0 else self._in(request, bucket(evidence), pooled, at)

    def _in(self, request: int, key: int, pooled: Sequence[float], at: int | None) -> list[float]:
        """:meth:`alpha` in bucket ``key``."""
        batch = self.kept.get(key, Tally()).alpha(pooled, _BATCH_WEIGHT)
        if at is None:
            return batch
        batch = self.kept.get((key, band(at)), Tally()).alpha(batch, _BATCH_WEIGHT)
        own = self.own.get((request, key, band(at)))
        return batch if own is None else own.alpha(batch, _OWN_WEIGHT)
