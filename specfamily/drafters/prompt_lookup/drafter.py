"""Prompt lookup decoding: propose the tokens that followed an earlier occurrence of the context's last n-gram.

Deterministic (q = None); the context is prompt + committed tokens, so the first pass drafts too. A
:class:`NgramIndex` per request is extended with each pass's committed tokens. With ``branches`` > 1, distinct
earlier matches are merged into a token tree (best match first); ``branches`` None takes one branch under greedy
decoding and more when sampling (:func:`~specfamily.drafters.prompt_lookup.config.resolve_branches`).
"""

from __future__ import annotations

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.prompt_lookup.config import PromptLookupConfig, resolve_branches
from specfamily.drafters.prompt_lookup.index import NgramIndex, build_trie


class PromptLookupDrafter(BaseDrafter):
    """Copies up to gamma tokens from the most recent earlier match of the last max_ngram..min_ngram tokens."""

    default_gamma = 10

    def __init__(
        self,
        target: Target | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        min_ngram: int = 1,
        max_ngram: int = 3,
        branches: int | None = None,
    ) -> None:
        self.config = PromptLookupConfig(gamma, policy, min_ngram, max_ngram, branches)
        super().__init__(gamma, policy)
        self.stop: frozenset[int] = frozenset(target.eos_token_ids) if target is not None else frozenset()
        self.index = NgramIndex(min_ngram, max_ngram)

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.stop = frozenset(ctx.target.eos_token_ids)
        self.index = NgramIndex(self.config.min_ngram, self.config.max_ngram, ctx.tokens)

    def observe(self, outcome: VerifyOutcome) -> None:
        """Nothing: the index catches up with the committed tokens when it next proposes (``_sync``), so a pass
        that asked it for nothing (a batched pass whose plan drafts nothing) costs it nothing."""

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        self._sync(ctx.tokens)
        branches = resolve_branches(self.config.branches, ctx.sampling.greedy)
        paths = self.index.propose(gamma, branches, self.stop)
        if not paths:
            return Draft.empty()
        if len(paths) == 1:
            return Draft(torch.tensor(paths[0], dtype=torch.long), torch.arange(len(paths[0])) - 1,
                         evidence=self.index.matched)
        tokens, parents = build_trie(paths)
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     evidence=self.index.matched)

    def _sync(self, tokens: list[int]) -> None:
        """Catch up with the tokens committed since the last proposal; rebuild if the context is not an extension.

        Within a request (``begin`` first) the context only grows, so the index is an extension's prefix when its
        last token is the context's at that position: only that token is compared, the check stays O(1) per
        proposal.
        """
        index = self.index
        if len(index) == len(tokens) and (not tokens or index.tokens[-1] == tokens[-1]):
            return
        if 0 < len(index) < len(tokens) and index.tokens[-1] == tokens[len(index) - 1]:
            index.extend(tokens[len(index) :])
        else:
            self.index = NgramIndex(self.config.min_ngram, self.config.max_ngram, tokens)
