"""The honest drafters the conformance kit's rogues are built on (``specfamily.testing.rogues``), and the honest
twins of its protocol checks: a chain and a tree drafted from the target's logits plus a fixed random tilt, feature
heads, a drafter with side rows, a merge of two parts. Each must pass the kit at its defaults; each rogue is one of
these with one realistic bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.sampling import warp
from specfamily.core.side_rows import SideRows
from specfamily.core.tree_merge import MergedTree, merge_drafts
from specfamily.core.types import Draft, SamplingConfig, VerifyOutcome

_MEMO_LIMIT = 200_000


class TargetLogits:
    """The target model's next-token logits (V,) float64 for a context, memoised (tiny vocabularies revisit them)."""

    def __init__(self, model) -> None:
        self.model = model
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.inference_mode()
    def __call__(self, tokens: Sequence[int]) -> torch.Tensor:
        key = tuple(tokens)
        logits = self.memo.get(key)
        if logits is None:
            ids = torch.tensor([key], device=self.model.device)
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].double().cpu()
            if len(self.memo) < _MEMO_LIMIT:
                self.memo[key] = logits
        return logits


def _normalised(weights: torch.Tensor) -> torch.Tensor:
    return weights / weights.sum(dim=-1, keepdim=True)


class HonestChain(BaseDrafter):
    """Samples a chain from q = warp(target logits + a fixed tilt) and reports that q: lossless (the control)."""

    default_gamma = 3
    batch_shared = ("logits",)  # batched decoding: the slots share the memo of the target's logits (not a request's)

    def __init__(self, target, gamma: int | None = 3, noise: float = 0.5, seed: int = 0) -> None:
        super().__init__(gamma, "constant")
        gen = torch.Generator().manual_seed(seed)
        self.logits = TargetLogits(target.model)
        self.tilt = noise * torch.randn(target.vocab_size, generator=gen, dtype=torch.float64)
        self.skew = torch.randn(target.vocab_size, generator=gen, dtype=torch.float64)  # for rogues that misreport

    def draft_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.logits(tokens) + self.tilt

    def sample_law(self, logits: torch.Tensor, sampling: SamplingConfig, depth: int) -> torch.Tensor:
        """The law the token at ``depth`` is drawn from."""
        return warp(logits, sampling).double()

    def reported(self, logits: torch.Tensor, sampling: SamplingConfig, depth: int, law: torch.Tensor) -> torch.Tensor:
        """The q reported for it."""
        return law

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        tokens: list[int] = []
        qs = []
        for depth in range(1, gamma + 1):
            logits = self.draft_logits(ctx.tokens + tokens)
            if ctx.sampling.greedy:
                tokens.append(int(logits.argmax()))
                continue
            law = self.sample_law(logits, ctx.sampling, depth)
            tokens.append(int(torch.multinomial(law, 1, generator=ctx.generator)))
            qs.append(self.reported(logits, ctx.sampling, depth, law))
        return Draft.chain(tokens, torch.stack(qs) if qs else None)


class HonestSideRows(HonestChain):
    """:class:`HonestChain` whose drafts also carry side rows (two branches of ``side`` guesses drawn from its own
    generator, as a lookahead window would): lossless, since no verification row may see them (the control for the
    side-rows gallery of ``specfamily.testing.mutants``). Checks that their logits come back, one row each."""

    def __init__(self, target, gamma: int | None = 3, side: int = 8, **kw) -> None:
        super().__init__(target, gamma, **kw)
        self.side, self.vocab = side, target.vocab_size
        self.guesses = torch.Generator().manual_seed(1)
        self.sent = 0

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        draft = super().propose(ctx, gamma)
        tokens = torch.randint(0, self.vocab, (2 * self.side,), generator=self.guesses)
        parents = [-1, *range(self.side - 1), -1, *range(self.side, 2 * self.side - 1)]
        draft.side = SideRows.branches(tokens, parents)
        self.sent = len(draft.side)
        return draft

    def observe(self, outcome: VerifyOutcome) -> None:
        got = None if outcome.side_logits is None else tuple(outcome.side_logits.shape)
        if got != (self.sent, self.vocab):
            raise AssertionError(f"side logits of shape {got} for {self.sent} side rows")


@dataclass
class _Node:
    token: int
    parent: int
    context: list[int]  # the tokens it was drawn after (context + its path)


class HonestTree(HonestChain):
    """A sampled tree: ``siblings`` i.i.d. children per node (depth 1), one child below each further node;
    each node reports the q of its parent's context. Lossless (the control)."""

    def __init__(self, target, gamma: int | None = 3, siblings: int = 2, **kw) -> None:
        super().__init__(target, gamma, **kw)
        self.siblings = siblings

    def draw(self, context: list[int], count: int, sampling: SamplingConfig, gen) -> tuple[list[int], torch.Tensor]:
        """``count`` children of a node with this context and the q each reports."""
        law = self.sample_law(self.draft_logits(context), sampling, 0)
        return [int(t) for t in torch.multinomial(law, count, replacement=True, generator=gen)], law

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        if ctx.sampling.greedy:
            return super().propose(ctx, gamma)
        nodes: list[_Node] = []
        qs: list[torch.Tensor] = []
        tokens, q = self.draw(ctx.tokens, self.siblings, ctx.sampling, ctx.generator)
        for token in tokens:
            nodes.append(_Node(token, -1, ctx.tokens + [token]))
            qs.append(q)
        frontier = list(range(len(nodes)))
        for _ in range(gamma - 1):
            grown = []
            for parent in frontier:
                token, q = self.child(nodes, parent, ctx)
                nodes.append(_Node(token, parent, nodes[parent].context + [token]))
                qs.append(q)
                grown.append(len(nodes) - 1)
            frontier = grown
        return Draft([n.token for n in nodes], [n.parent for n in nodes], torch.stack(qs))

    def child(self, nodes: list[_Node], parent: int, ctx: DecodeContext) -> tuple[int, torch.Tensor]:
        """One child of node ``parent``: (token, reported q)."""
        tokens, q = self.draw(nodes[parent].context, 1, ctx.sampling, ctx.generator)
        return tokens[0], q


class FeatureHeads(BaseDrafter):
    """A Medusa-style feature drafter: head d draws the token at depth d from warp(LM head(f) + tilt_d), f the
    target feature that produced the root; reports that q. Lossless (the control); nothing on the first pass."""

    needs_features = True
    default_gamma = 3

    def __init__(self, target, gamma: int | None = 3, noise: float = 1.0, seed: int = 0) -> None:
        super().__init__(gamma, "constant")
        self.head = target.model.get_output_embeddings()
        gen = torch.Generator().manual_seed(seed)
        self.tilts = noise * torch.randn(8, target.vocab_size, generator=gen, dtype=torch.float64)
        self.rows: torch.Tensor | None = None  # the last two committed features (2, H)

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.rows = None

    def observe(self, outcome: VerifyOutcome) -> None:
        rows = outcome.features if self.rows is None else torch.cat([self.rows, outcome.features])
        self.rows = rows[-2:]

    def laws(self, feature: torch.Tensor, gamma: int, sampling: SamplingConfig) -> torch.Tensor:
        logits = self.head(feature).double() + self.tilts[:gamma]  # (gamma, V)
        return warp(logits, sampling).double()

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        if self.rows is None or self.rows.shape[0] < 2 or ctx.sampling.greedy:
            return Draft.empty()
        laws = self.laws(self.rows[-1], gamma, ctx.sampling)
        tokens = torch.multinomial(laws, 1, generator=ctx.generator).view(-1)
        return Draft.chain(tokens, self.reported(laws, gamma, ctx.sampling))

    def reported(self, laws: torch.Tensor, gamma: int, sampling: SamplingConfig) -> torch.Tensor:
        return laws


class TopChain(HonestChain):
    """Proposes the argmax chain of its tilted logits whatever the sampling, q = None: a deterministic part."""

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        tokens: list[int] = []
        for _ in range(gamma):
            tokens.append(int(self.draft_logits(ctx.tokens + tokens).argmax()))
        return Draft.chain(tokens)


class HonestMerge(BaseDrafter):
    """Two parts merged by :func:`specfamily.core.tree_merge.merge_drafts` (as the merge drafter does): a
    deterministic argmax chain, then a sampled chain from another tilt; each node reports the row of the draw that
    put it there. Lossless (the control)."""

    default_gamma = 3

    def __init__(self, target, gamma: int | None = 3) -> None:
        super().__init__(gamma, "constant")
        self.parts = [TopChain(target, gamma, seed=1), HonestChain(target, gamma, noise=1.0, seed=2)]

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        drafts = [part.propose(ctx, gamma) for part in self.parts]
        return self.reported(merge_drafts(drafts, ctx.target.vocab_size), drafts)

    def reported(self, merged: MergedTree, drafts: list[Draft]) -> Draft:
        return merged.draft
