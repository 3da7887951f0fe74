"""Token Recycling (Luo et al., 2024): the target's own top-k candidates from earlier passes, recycled as drafts.

Every pass already computes logits after the root and after each drafted node, accepted or not; ``observe`` keeps
each fed token's top-k successors in an :class:`AdjacencyTable` (one table for the drafter's life, as the
reference's one matrix per run, unless ``keep=False``). ``propose`` grows a static template tree from the
context's last token through that table (:func:`grow`), or, with ``template="scored"``, the most likely nodes by
the recycled probabilities (:func:`grow_scored`). No model of its own, deterministic (q = None): lossless
under sampling, the target's own greedy text at temperature 0.
"""

from __future__ import annotations

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.recycling.config import SCORED, SCORED_DEPTH, SCORED_SIZE, RecyclingConfig
from specfamily.drafters.recycling.scored import grow_scored
from specfamily.drafters.recycling.table import AdjacencyTable, check_rows, joined_rows
from specfamily.drafters.recycling.template import grow, make_template


class RecyclingDrafter(BaseDrafter):
    """Grows the template from the last token through the adjacency table; learns the table from each pass."""

    auto_max_gamma = None  # auto drafts at most the template's depth
    batch_shared = ("table",)  # batched decoding: every slot learns into and drafts from the one table (keep=True)

    def __init__(
        self,
        target: Target | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        top_k: int = 8,
        template: str = "scored",
        max_tree_size: int | None = 8,
        keep: bool = True,
        threshold: float = 0.35,
    ) -> None:
        self.config = RecyclingConfig(gamma, policy, top_k, template, max_tree_size, keep, threshold)
        self.template = None if template == SCORED else make_template(template, max_tree_size, top_k)
        self.default_gamma = SCORED_DEPTH if self.template is None else self.template.depth
        super().__init__(gamma, policy)
        self.stop: frozenset[int] = frozenset(target.eos_token_ids) if target is not None else frozenset()
        self.table: AdjacencyTable | None = None
        if target is not None:
            self.table = AdjacencyTable.empty(target.vocab_size, top_k)
        self._fed: list[int] = []  # the last pass's fed tokens: root, then the draft's nodes
        self._last = -1  # the context's last token, the root of the next pass

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.stop = frozenset(ctx.target.eos_token_ids)
        vocab = ctx.target.vocab_size
        table = self.table
        if table is None or not self.config.keep or table.successors.shape[0] != vocab:
            self.table = AdjacencyTable.empty(vocab, self.config.top_k)
        self._last, self._fed = ctx.tokens[-1], []

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        root = self._last = ctx.tokens[-1]
        table, config = self.table, self.config
        table.flush()  # the rows of idle batched passes, scored before the table is read
        if self.template is None:
            tokens, parents = grow_scored(root, table.successors, table.scores, table.known,
                                          config.max_tree_size or SCORED_SIZE, gamma, config.threshold, self.stop)
        else:
            tokens, parents = grow(root, table.successors, table.known, self.template, gamma, self.stop)
        self._fed = [root, *tokens]
        if not tokens:
            return Draft.empty()
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))

    def observe(self, outcome: VerifyOutcome) -> None:
        """Rewrite the rows of every token this pass fed (the root, every drafted node) from its logits."""
        if outcome.logits is not None and self.table is not None:
            self.table.update(self._fed_tokens(outcome), outcome.logits)
        self._fed, self._last = [], outcome.tokens[-1]

    def observe_batch(self, drafters: list, outcomes: list[VerifyOutcome]) -> None:
        """Batched decoding: every slot's fed rows scored in one top-k over the pass's logits (``AdjacencyTable
        .scored``), then written into each slot's table in slot order, as each slot's ``observe`` would; on a pass
        where no slot was asked for a draft, the rows are deferred (``AdjacencyTable.defer``) until the table is
        next read."""
        tables = [getattr(d, "table", None) for d in drafters]
        if (len(drafters) < 2 or not all(type(d) is type(self) for d in drafters) or
                any(t is None or t.k != self.config.top_k for t in tables) or
                any(o.logits is None or o.logits.shape[-1] != outcomes[0].logits.shape[-1] for o in outcomes)):
            super().observe_batch(drafters, outcomes)
            return
        fed = [d._fed_tokens(o) for d, o in zip(drafters, outcomes, strict=True)]
        for tokens, outcome in zip(fed, outcomes, strict=True):
            check_rows(tokens, outcome.logits)
        logits = joined_rows([o.logits for o in outcomes])  # one view where they are one pass's rows
        if all(t is tables[0] for t in tables) and not any(d._fed for d in drafters):  # no slot asked: kept for later
            tables[0].defer([token for tokens in fed for token in tokens], logits)
            for drafter, outcome in zip(drafters, outcomes, strict=True):
                drafter._last = outcome.tokens[-1]
            return
        for table in {id(t): t for t in tables}.values():  # what waits is older than this pass's rows
            table.flush()
        successors, scores = tables[0].scored(logits)
        start = 0
        for drafter, table, tokens, outcome in zip(drafters, tables, fed, outcomes, strict=True):
            table.write(tokens, successors[start:start + len(tokens)], scores[start:start + len(tokens)])
            start += len(tokens)
            drafter._fed, drafter._last = [], outcome.tokens[-1]

    def _fed_tokens(self, outcome: VerifyOutcome) -> list[int]:
        """The tokens the pass fed: the root, then the draft's nodes as fed (the batched loop may have cut the
        proposal's levels: ``outcome.drafted``), or the proposal's own when not told."""
        if outcome.drafted is not None:
            return [self._last, *outcome.drafted.tolist()]
        return self._fed if len(self._fed) == outcome.draft_size + 1 else [self._last]  # none: the root alone
