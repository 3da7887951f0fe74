"""Lookahead decoding (Fu et al., ICML 2024): no second model, the target's own pass runs the Jacobi iteration.

Each pass carries two branches: the lookahead branch, a window of W x (N - 1) guesses fed as side rows (never
verified, never committed; ``specfamily.core.side_rows``) whose logits advance the Jacobi iteration and complete
n-grams for the pool; and the verification branch, up to G of the pool's continuations of the last committed token,
a chain or a token tree verified by the shared verifier. The candidates are deterministic proposals (q = None), so
the text follows the target's law exactly (greedy: its greedy text).
"""

from __future__ import annotations

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.lookahead.config import LookaheadConfig
from specfamily.drafters.lookahead.pool import NgramPool, trie
from specfamily.drafters.lookahead.window import JacobiWindow, advance, initial_guesses, window_rows


class LookaheadDrafter(BaseDrafter):
    """Verifies up to ``guesses`` pool n-grams per pass while a ``window`` x (``ngram`` - 1) Jacobi window rides along
    in side rows."""

    def __init__(
        self,
        target: Target | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        window: int = 1,
        ngram: int = 3,
        guesses: int = 1,
        prompt_pool: bool = True,
        seed: int = 0,
    ) -> None:
        self.config = LookaheadConfig(gamma, policy, window, ngram, guesses, prompt_pool, seed)
        self.default_gamma = ngram - 1
        super().__init__(ngram - 1 if gamma is None else gamma, policy)
        self.stop: frozenset[int] = frozenset(target.eos_token_ids) if target is not None else frozenset()
        self.pool = NgramPool(guesses)
        self.window = JacobiWindow(window, ngram - 1)
        self.pooled = 0  # context tokens whose n-grams are in the pool (prompt_pool)
        self.sent = False  # the last proposal carried the window

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        config = self.config
        self.stop = frozenset(ctx.target.eos_token_ids)
        self.pool = NgramPool(config.guesses)
        generator = torch.Generator().manual_seed(config.seed)
        self.window = JacobiWindow(config.window, config.ngram - 1, [initial_guesses(ctx.tokens, config.window,
                                                                                      generator)])
        self.pooled, self.sent = 0, False
        self._pool_context(ctx.tokens)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        self._pool_context(ctx.tokens)
        config = self.config
        length = min(gamma, config.ngram - 1)
        paths = self.pool.candidates(ctx.tokens[-1], length, config.guesses, self.stop)
        side = window_rows(self.window.levels)
        self.sent = True
        if not paths:
            return Draft(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), side=side)
        if len(paths) == 1:
            return Draft.chain(torch.tensor(paths[0], dtype=torch.long), side=side)
        tokens, parents = trie(paths)
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), side=side)

    def observe(self, outcome: VerifyOutcome) -> None:
        if self.sent and outcome.side_logits is not None:
            for gram in advance(self.window, outcome.side_logits):
                self.pool.add(gram)
        self.sent = False

    def _pool_context(self, tokens: list[int]) -> None:
        """Put the n-grams of context tokens not pooled yet in the pool (with ``prompt_pool``)."""
        if not self.config.prompt_pool:
            return
        size = self.config.ngram
        if len(tokens) < self.pooled:  # another context: start over
            self.pooled = 0
        self.pool.add_text(tokens, size, self.pooled - size + 1)
        self.pooled = len(tokens)
