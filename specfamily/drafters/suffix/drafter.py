"""SuffixDecoding (Oliaro et al., NeurIPS 2025): speculation trees from suffix indexes, deterministic (q = None).

Two suffix indexes (:mod:`specfamily.drafters.suffix.automaton`): this request's prompt and committed tokens, and a
global one over earlier requests' outputs that lives with the drafter object (``end()`` adds the request, a token
budget evicts the oldest, ``save_cache``/``cache=`` carry it between runs). Each proposal grows a speculation tree
from the longest matched suffix in each (:mod:`specfamily.drafters.suffix.speculate`) and proposes the request's own
unless it is empty (``choose=own``) or the higher-scored one (``score``, the paper's rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.drafters.suffix.automaton import Matcher, Sequence, SuffixIndex
from specfamily.drafters.suffix.cache import GlobalCache
from specfamily.drafters.suffix.config import SuffixConfig
from specfamily.drafters.suffix.speculate import Limits, Speculation, best_match, better


@dataclass
class RequestState:
    """One request: its own index (and the sequence that extends it), its match in the global index, its tokens."""

    index: SuffixIndex
    sequence: Sequence
    matcher: Matcher
    tokens: list[int] = field(default_factory=list)  # what the indexes have seen: prompt + committed
    prompt_length: int = 0

    @classmethod
    def start(cls, tokens: list[int], prompt_length: int, max_depth: int, global_index: SuffixIndex) -> RequestState:
        index = SuffixIndex(max_depth)
        state = cls(index, Sequence(index), Matcher(global_index), [], prompt_length)
        state.extend(tokens)
        return state

    def extend(self, tokens: list[int]) -> None:
        self.sequence.extend(tokens)
        self.matcher.extend(tokens)
        self.tokens += tokens

    def follows(self, tokens: list[int]) -> bool:
        """Whether ``tokens`` extends (or equals) what this state has seen; O(1): lengths and one token."""
        n = len(self.tokens)
        return len(tokens) >= n and (n == 0 or tokens[n - 1] == self.tokens[-1])


class SuffixDrafter(BaseDrafter):
    """Proposes the per-request or the global speculation tree (or chain), as ``choose`` says (see the config)."""

    default_gamma = 16
    batch_shared = ("global_cache",)  # batched decoding: every slot learns into and reads the one global cache

    def __init__(
        self,
        target: Target | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        mode: str = "tree",
        max_depth: int = 64,
        max_spec_factor: float = 1.0,
        max_spec_offset: float | None = None,
        min_token_prob: float = 0.1,
        max_tree_size: int = 16,
        max_cached_tokens: int = 16384,
        cache_prompts: bool = False,
        cache: str | Path | None = None,
        choose: str = "own",
        recency: bool = False,
    ) -> None:
        self.config = SuffixConfig(gamma, policy, mode, max_depth, max_spec_factor, max_spec_offset, min_token_prob,
                                   max_tree_size, max_cached_tokens, cache_prompts, cache, choose, recency)
        super().__init__(gamma, policy)
        self.limits = Limits(max_spec_factor, max_spec_offset, max_tree_size, min_token_prob, mode == "chain", recency)
        self.stop: frozenset[int] = frozenset(target.eos_token_ids) if target is not None else frozenset()
        self.vocab_size: int | None = target.vocab_size if target is not None else None
        self.global_cache = GlobalCache(max_depth, max_cached_tokens)
        self.request: RequestState | None = None
        self._ctx: DecodeContext | None = None  # the request begun, whose tokens end() adds to the global cache
        self.last: Speculation | None = None  # the latest proposal, with its match length and score
        if cache is not None:
            self.load_cache(cache)

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.stop = frozenset(ctx.target.eos_token_ids)
        self.request = self._start(ctx)
        self._ctx = ctx

    def _start(self, ctx: DecodeContext) -> RequestState:
        return RequestState.start(list(ctx.tokens), len(ctx.prompt_ids), self.config.max_depth, self.global_cache.index)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        state = self._sync(ctx)
        limits = self.limits
        if limits.max_spec_offset is None and gamma < limits.max_tree_size:
            limits = replace(limits, max_tree_size=gamma)  # no more tokens than a chain of gamma
        own = best_match(state.index, state.sequence.suffix_nodes(gamma), gamma, limits, self.stop)
        if own.tokens and self.config.choose == "own":  # the global tree would not be chosen
            cached = Speculation()
        else:
            cached = best_match(self.global_cache.index, state.matcher.suffix_nodes(gamma), gamma, limits, self.stop)
        self.last = best = better(own, cached, self.config.choose)
        if not best.tokens:
            return Draft.empty()
        tokens = torch.tensor(best.tokens, dtype=torch.long)
        parents = torch.arange(len(tokens)) - 1 if limits.chain else torch.tensor(best.parents, dtype=torch.long)
        return Draft(tokens, parents, evidence=best.match_length)

    def _sync(self, ctx: DecodeContext) -> RequestState:
        """Catch up with the committed tokens; start over when the context is not an extension of what was seen."""
        state = self.request
        if state is None or not state.follows(ctx.tokens):
            state = self.request = self._start(ctx)
        elif len(ctx.tokens) > len(state.tokens):
            state.extend(ctx.tokens[len(state.tokens) :])
        return state

    def end(self) -> None:
        """Add the finished request to the global cache (its output, and its prompt with ``cache_prompts``)."""
        state, ctx = self.request, self._ctx
        self.request, self._ctx = None, None
        if state is None or ctx is None:
            return
        start = 0 if self.config.cache_prompts else state.prompt_length
        self.global_cache.add(ctx.tokens[start:])

    def save_cache(self, path: str | Path) -> Path:
        """Write the global cache (its sequences) to ``path`` atomically: JSON for ``.json``, else safetensors."""
        return self.global_cache.save(path)

    def load_cache(self, path: str | Path) -> int:
        """Add a saved cache's sequences to the global cache (within its budget); returns how many were read."""
        return self.global_cache.load(path, self.vocab_size)
