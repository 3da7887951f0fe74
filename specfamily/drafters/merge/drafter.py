"""The merge drafter: its parts propose, their trees are merged into one (:mod:`specfamily.core.tree_merge`), the
shared verifier checks it, and each part is told what it alone would have had accepted.

Each part keeps its own state: it is begun, asked to propose and ended as if it drafted alone, and observes the
verification with its own nodes on the accepted path (as far as its tree follows it), its own draft size, and the
target's features it asked for (parts asking for layers get their layers out of the union of every part's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfamily.core.batch_slots import propose_batch
from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter, Drafter, hooks
from specfamily.core.plugins import create_drafter
from specfamily.core.policy import AutoPolicy
from specfamily.core.schedules import ConstantPolicy
from specfamily.core.target import Target
from specfamily.core.tree_merge import MergedTree, merge_drafts
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.merge.config import DEFAULT_PARTS, MergeConfig
from specfamily.drafters.merge.policy import PartPass, PartsPolicy


@dataclass(frozen=True)
class FeaturePlan:
    """What the merged drafter asks the target for (``needs``) and, per part, which of those features it gets:
    None (none), () (all of them as they come), or the positions of its layers in ``needs``."""

    needs: bool | tuple[int, ...]
    picks: tuple[tuple[int, ...] | None, ...]

    def part_features(self, part: int, features: torch.Tensor | None) -> torch.Tensor | None:
        """(m, k * H) the features part ``part`` asked for, out of (m, K * H) for all of ``needs``."""
        pick = self.picks[part]
        if pick is None or features is None:
            return None
        if not pick:
            return features
        width = features.shape[-1] // len(self.needs)
        return torch.cat([features[:, i * width : (i + 1) * width] for i in pick], dim=-1)


def feature_plan(needs: Sequence[bool | tuple[int, ...]], names: Sequence[str]) -> FeaturePlan:
    """One request for the target's features serving every part: the last normed state, or the union of layers."""
    asking = [need for need in needs if need]
    if not asking:
        return FeaturePlan(False, tuple(None for _ in needs))
    if all(need is True for need in asking):
        return FeaturePlan(True, tuple(() if need else None for need in needs))
    if any(need is True for need in asking):
        last = [name for name, need in zip(names, needs, strict=True) if need is True]
        layers = [name for name, need in zip(names, needs, strict=True) if isinstance(need, tuple)]
        raise ValueError(f"merge cannot feed one pass's features to both kinds of feature parts: {last} need the "
                         f"last normed state, {layers} need layer features")
    union = tuple(dict.fromkeys(layer for need in asking for layer in need))
    picks = tuple(None if not need else tuple(union.index(layer) for layer in need) for need in needs)
    if all(pick is None or pick == tuple(range(len(union))) for pick in picks):
        picks = tuple(None if pick is None else () for pick in picks)
    return FeaturePlan(union, picks)


class MergeDrafter(BaseDrafter):
    """Proposes the merge of its parts' drafts. Without a merged gamma or policy (``auto``), each part drafts what its
    own policy says pays (:class:`~specfamily.drafters.merge.policy.PartsPolicy`; 0: it adds nothing that pass);
    otherwise a part's depth is the merged draft's. Either way capped by the gamma the part was given (its ``gamma``
    option) or else its own default."""

    def __init__(self, target: Target, parts: Sequence[str | Drafter] = DEFAULT_PARTS, options: dict | None = None,
                 gamma: int | None = None, policy: str | None = None, min_tokens: int | None = None,
                 credit: str = "marginal") -> None:
        self.config = MergeConfig(list(parts), options, gamma, policy, min_tokens, credit)
        self.parts: list[Drafter] = [_build(part, target, self.config.options) for part in self.config.parts]
        self.names = [part if isinstance(part, str) else type(part).__name__ for part in self.config.parts]
        for name, part in zip(self.names, self.parts, strict=True):
            if part.lossy:
                raise ValueError(f"merge cannot take the lossy drafter {name!r}: its acceptance rule is its own")
        self.caps = [_cap(part) for part in self.parts]
        self.default_gamma = max((cap for cap in self.caps if cap is not None), default=BaseDrafter.default_gamma)
        self.auto_max_gamma = None  # auto never drafts deeper than the deepest part's own depth
        super().__init__(gamma, policy)
        if isinstance(self.policy, AutoPolicy):  # the parts decide, each with its own policy and costs
            self.policy = PartsPolicy([part.policy for part in self.parts], self.caps, self.names,
                                      credit=self.config.credit)
        self.features = feature_plan([part.needs_features for part in self.parts], self.names)
        self.needs_features = self.features.needs
        self.last: MergedTree | None = None  # the latest merge, until its verification is observed
        self.passes: list[PartPass] = []  # each part's draft and time in it

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.last = None
        for part in self.parts:
            part.begin(ctx)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        """Every part's draft (with ``min_tokens``, a part's only while the drafts before it hold fewer tokens: a
        choice made from those drafts alone, independent of its own draws, so the merge stays exact), merged."""
        passes, drafted, enough = [], 0, self.config.min_tokens
        for part, part_gamma in zip(self.parts, self._part_gammas(gamma), strict=True):
            if part_gamma <= 0 or (enough is not None and drafted >= enough):
                passes.append(PartPass(Draft.empty()))  # not asked: it observes a pass it did not draft for
                continue
            started = time.perf_counter()
            part_draft = part.propose(ctx, part_gamma)
            passes.append(PartPass(part_draft, time.perf_counter() - started, asked=True))
            drafted += len(part_draft)
        return self._merged(passes, ctx.target.vocab_size)

    def propose_batch(self, drafters: list, ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """Batched decoding: each part proposes for every slot in one call of its own ``propose_batch`` (a model
        part's draft forwards batched), then each slot's parts' drafts are merged, as :meth:`propose` does for one.
        A part's seconds are its call's, shared by the slots it drafted for."""
        if not all(type(d) is type(self) and len(d.parts) == len(self.parts) for d in drafters):
            return super().propose_batch(drafters, ctxs, gammas)
        asking = [i for i, gamma in enumerate(gammas) if gamma > 0]
        plans = {i: drafters[i]._part_gammas(gammas[i]) for i in asking}
        passes: dict[int, list[PartPass]] = {i: [] for i in asking}
        drafted, enough = dict.fromkeys(asking, 0), self.config.min_tokens
        for k, part in enumerate(self.parts):
            ask = [0] * len(drafters)
            for i in asking:
                if plans[i][k] > 0 and (enough is None or drafted[i] < enough):
                    ask[i] = plans[i][k]
            drafts, share = [Draft.empty()] * len(drafters), 0.0
            if any(ask):
                started = time.perf_counter()
                drafts = propose_batch(part, [d.parts[k] for d in drafters], ctxs, ask)
                share = (time.perf_counter() - started) / sum(gamma > 0 for gamma in ask)
            for i in asking:
                passes[i].append(PartPass(drafts[i], share, asked=True) if ask[i] else PartPass(Draft.empty()))
                drafted[i] += len(drafts[i])
        merged = [Draft.empty()] * len(drafters)
        for i in asking:
            merged[i] = drafters[i]._merged(passes[i], ctxs[i].target.vocab_size)
        return merged

    def _part_gammas(self, gamma: int) -> list[int]:
        """Each part's length this pass: ``gamma`` under its cap, and under its own policy's plan (``PartsPolicy``:
        decided before anything was drawn this pass)."""
        planned = self.policy.take() if isinstance(self.policy, PartsPolicy) else None
        gammas = [gamma if cap is None else min(gamma, cap) for cap in self.caps]
        if planned is not None:
            gammas = [min(own, part_gamma) for own, part_gamma in zip(planned, gammas, strict=True)]
        return gammas

    def _merged(self, passes: list[PartPass], vocab_size: int) -> Draft:
        """The parts' drafts merged into this pass's draft, kept (``last``, ``passes``) until its verification."""
        self.passes = passes
        drafts = [own.draft for own in passes]
        self.last = merge_drafts(drafts, vocab_size)
        draft = self.last.draft
        draft.catch_up_seconds = sum(part_draft.catch_up_seconds for part_draft in drafts)
        return draft

    def observe(self, outcome: VerifyOutcome) -> None:
        """Each part observes the verification as if it had drafted alone (what of its tree was accepted)."""
        merged, self.last = self.last, None
        paths = []
        for k, part in enumerate(self.parts):
            path = [] if merged is None else merged.part_path(k, outcome.accepted_nodes)
            size = 0 if merged is None else len(merged.at[k])
            features = self.features.part_features(k, outcome.features)
            part.observe(VerifyOutcome(outcome.tokens, path, size, features, outcome.feature_start))
            paths.append(path)
        if isinstance(self.policy, PartsPolicy) and merged is not None:
            self.policy.report_parts(self.passes, paths)

    def end(self) -> None:
        self.last = None
        for part in self.parts:
            hooks(part).end()


def _build(part: str | Drafter, target: Target, options: dict[str, dict]) -> Drafter:
    if not isinstance(part, str):
        if not isinstance(part, Drafter):
            raise TypeError(f"merge parts must be drafter names or drafters, got {type(part).__name__}")
        return part
    return create_drafter(part, target, **options.get(part, {}))


def _cap(part: Drafter) -> int | None:
    """The most a part drafts: the gamma it was given (a constant policy's), else its own default (None for a
    drafter without one)."""
    if isinstance(part.policy, ConstantPolicy):
        return part.policy.gamma
    return getattr(part, "default_gamma", None)
