"""A rogues' gallery: subtly wrong drafters the conformance suite must reject (not registered by default).

Each rogue is the honest drafter next to it with one realistic bug; a test that passes a rogue proves nothing about
that bug. The honest base drafts from the target's logits plus a fixed random tilt (``noise``), accepted often
enough to reach depth 3 and rejected often enough to exercise the residual. Only a q that differs from the law a
token was drawn from breaks losslessness, so the feature and parent rogues draw one way and report the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.sampling import warp
from specfamily.core.tree_merge import MergedTree
from specfamily.core.types import Draft, SamplingConfig
from specfamily.testing.honest import (  # noqa: F401  (re-exported: the kit's names for its honest drafters)
    FeatureHeads,
    HonestChain,
    HonestMerge,
    HonestSideRows,
    HonestTree,
    TargetLogits,
    TopChain,
    _normalised,
)


class LateMisreport(HonestChain):
    """Honest at depths 1 and 2; from depth 3 reports q tilted by a fixed random factor (same support)."""

    def __init__(self, target, gamma: int | None = 3, from_depth: int = 3, strength: float = 1.0, **kw) -> None:
        super().__init__(target, gamma, **kw)
        self.from_depth, self.strength = from_depth, strength

    def reported(self, logits, sampling, depth, law):
        if depth < self.from_depth:
            return law
        return _normalised(law * torch.exp(self.strength * self.skew))


def cost_aware(drafter: BaseDrafter) -> BaseDrafter:
    """The drafter with the default policy of a drafter written as the README shows (no gamma, no policy: the
    cost-aware ``auto``, which may decide to draft nothing)."""
    BaseDrafter.__init__(drafter, None, None)
    return drafter


class DefaultPolicyMisreport(LateMisreport):
    """:class:`LateMisreport` on the default (cost-aware) policy: a kit that let the policy choose the draft length
    would mostly test plain decoding and pass it."""

    def __init__(self, target, **kw) -> None:
        super().__init__(target, **kw)
        cost_aware(self)


class MixtureReport(HonestChain):
    """Samples from q but reports 0.7 q + 0.3 uniform."""

    def reported(self, logits, sampling, depth, law):
        return 0.7 * law + 0.3 / law.numel()


class TemperatureMismatch(HonestChain):
    """Samples at the request's temperature but reports q unscaled (temperature 1, same top-k/top-p): the
    temperature applied to the draw and not to what is reported. Exact at temperature 1, wrong below it."""

    def reported(self, logits, sampling, depth, law):
        return warp(logits, replace(sampling, temperature=1.0)).double()


def top_p_without_crossing(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """A top-p cut off by one: keeps tokens while the mass *including* them stays below top_p (the crossing token
    dropped; at least the most probable one kept)."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep_sorted = sorted_p.cumsum(dim=-1) < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return _normalised(probs * keep)


class TopPMismatch(HonestChain):
    """Draws from a top-p cut that drops the crossing token; reports the correct warp (crossing token kept)."""

    def sample_law(self, logits, sampling, depth):
        unwarped = warp(logits, replace(sampling, top_p=1.0)).double()
        return top_p_without_crossing(unwarped, sampling.top_p)

    def reported(self, logits, sampling, depth, law):
        return warp(logits, sampling).double()


class SiblingsWithoutReplacement(HonestTree):
    """Draws the root's children without replacement but reports each with the plain q (as if i.i.d.). Its q is
    further from p (``noise`` 1.5) so that first siblings are rejected often enough for the second to matter."""

    def __init__(self, target, gamma: int | None = 3, siblings: int = 2, noise: float = 1.5, **kw) -> None:
        super().__init__(target, gamma, siblings, noise=noise, **kw)

    def draw(self, context, count, sampling, gen):
        law = self.sample_law(self.draft_logits(context), sampling, 0)
        count = min(count, int((law > 0).sum()))
        return [int(t) for t in torch.multinomial(law, count, replacement=False, generator=gen)], law


class OffByOneParent(HonestTree):
    """The sampling loop reads the context of node ``parent - 1`` (the root for ``parent = 0``) where it should
    read ``parent``'s; the tree and the reported q use the right parent."""

    def child(self, nodes, parent, ctx):
        wrong = nodes[parent - 1].context if parent > 0 else ctx.tokens
        law = self.sample_law(self.draft_logits(wrong), ctx.sampling, 0)
        token = int(torch.multinomial(law, 1, generator=ctx.generator))
        return token, self.sample_law(self.draft_logits(nodes[parent].context), ctx.sampling, 0)


class UnnormalisedTopK(HonestChain):
    """Draws from the top-k-warped q but reports the full softmax masked to the top k without renormalising it (a
    row summing below 1): the verifier refuses such a q before it can inflate any acceptance ratio."""

    def reported(self, logits, sampling, depth, law):
        full = warp(logits, replace(sampling, top_k=0)).double()
        return full * (law > 0)


class ShiftedFeatures(FeatureHeads):
    """Draws from the heads on the right feature but reports q from the feature one position earlier."""

    def reported(self, laws, gamma, sampling):
        return self.laws(self.rows[-2], gamma, sampling)


class MisattributedMerge(HonestMerge):
    """Merges the same trie, but a node both parts drew reports the row of the last part that landed on it (a
    per-node q overwritten part after part): the sampled part's q for the deterministic part's node."""

    def reported(self, merged: MergedTree, drafts: list[Draft]) -> Draft:
        q = merged.draft.q
        if q is None:
            return merged.draft
        q = q.clone()
        for k, draft in enumerate(drafts):
            for i, node in enumerate(merged.at[k]):
                if draft.q is not None and merged.sources[node].part != k:  # laid by another part
                    q[node] = draft.q[i]
        return Draft(merged.draft.tokens, merged.draft.parents, q)


@dataclass(frozen=True)
class Rogue:
    """A gallery entry: the bug, how to build it, and a sampling config under which the suite rejects it."""

    name: str
    bug: str
    build: Callable
    sampling: SamplingConfig


def rogue_gallery() -> list[Rogue]:
    t1, t07, k5 = SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=5)
    return [
        Rogue("late_misreport", "q misreported only from depth 3", LateMisreport, t1),
        Rogue("default_policy_misreport", "q misreported from depth 3, on the cost-aware default policy",
              DefaultPolicyMisreport, t1),
        Rogue("mixture_report", "reports 0.7 q + 0.3 uniform", MixtureReport, k5),
        Rogue("siblings_without_replacement", "siblings drawn without replacement, reported i.i.d.",
              SiblingsWithoutReplacement, k5),
        Rogue("temperature_mismatch", "temperature applied to the draw, not to the reported q",
              TemperatureMismatch, t07),
        Rogue("top_p_mismatch", "top-p cut without the crossing token in the draw", TopPMismatch, t07),
        Rogue("shifted_features", "reported q from the feature one position early", ShiftedFeatures, t1),
        Rogue("off_by_one_parent", "children drawn in the context of node parent - 1", OffByOneParent, t1),
        Rogue("unnormalised_q", "reports top-k probabilities without renormalising (q sums below 1)",
              UnnormalisedTopK, k5),
        Rogue("misattributed_merge", "a merged node shared by two drafters reports the later drafter's q",
              MisattributedMerge, t1),
    ]


class DeepMisreport(LateMisreport):
    """:class:`LateMisreport` wrong only from depth 4, drafting 4 deep: a conformance run at gamma 3 never reaches the
    bug (and its verdict says it tested gamma 3); at ``gamma=4`` the kit must reject it. Not in the gallery, whose
    entries run at the kit's defaults."""

    default_gamma = 4

    def __init__(self, target, gamma: int | None = 4, from_depth: int = 4, **kw) -> None:
        super().__init__(target, gamma, from_depth, **kw)


class CrossRequestLeak(HonestChain):
    """A rogue of batched decoding: draws its chain from the draft law of ANOTHER live request's context (read from
    a board every slot shares) while it reports the q of its own. Alone in the batch it reads only itself: honest
    under ``generate``; beside other requests it draws from the wrong law."""

    batch_shared = ("board", "logits")

    def __init__(self, target, gamma: int | None = 3, **kw) -> None:
        super().__init__(target, gamma, **kw)
        self.board: dict[int, DecodeContext] = {}
        self._own: DecodeContext | None = None

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self._own = ctx
        self.board[id(ctx)] = ctx

    def end(self) -> None:
        self.board.pop(id(self._own), None)

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        other = next((c for key, c in self.board.items() if key != id(ctx)), ctx)
        tokens, qs = [], []
        for depth in range(1, gamma + 1):
            own = self.draft_logits(ctx.tokens + tokens)
            if ctx.sampling.greedy:
                tokens.append(int(own.argmax()))
                continue
            law = self.sample_law(self.draft_logits(other.tokens + tokens), ctx.sampling, depth)
            tokens.append(int(torch.multinomial(law, 1, generator=ctx.generator)))
            qs.append(self.sample_law(own, ctx.sampling, depth))
        return Draft.chain(tokens, torch.stack(qs) if qs else None)
