"""REST (He et al., NAACL 2024): draft what followed the context's longest matching suffix in a datastore of text.

The datastore (:class:`Datastore`: tokens and their suffix array, memory-mapped) is read-only; each proposal finds
the longest suffix of the context that occurs in it, reads the continuations after its occurrences and proposes the
most frequent of their prefixes as a token tree (:func:`frequent_tree`). No model, nothing learned while decoding,
deterministic (q = None): lossless under sampling, the target's own greedy text at temperature 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specfamily import zoo
from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.drafters.rest import default_store
from specfamily.drafters.rest.config import RestConfig
from specfamily.drafters.rest.datastore import Datastore
from specfamily.drafters.rest.retrieve import continuations, frequent_tree
from specfamily.drafters.rest.token_file import file_digest


def _zoo_name(target: Target) -> str:
    name = zoo.identify(target)
    if name is None:
        raise zoo.NoWeights("rest needs datastore=PATH for a target outside the zoo (build one with "
                            "specfamily.drafters.rest.datastore.build_datastore)")
    return name.removeprefix(zoo.ZOO_PREFIX)


def corpus_datastore(target: Target) -> Path:
    """Where the zoo corpus's datastore for a zoo target lives (``python -m specfamily.recipes.rest_datastore
    --code-corpus``); a NoWeights error for other targets."""
    from specfamily.zoo.fetch import cache_root

    return cache_root() / "rest" / _zoo_name(target)


def default_datastore(target: Target) -> Path:
    """Where a zoo target's default datastore lives: its shipped chat text's (named by the token file's digest, so
    a changed file is built anew), else the zoo corpus's (:func:`corpus_datastore`)."""
    from specfamily.zoo.fetch import cache_root

    name = _zoo_name(target)
    shipped = default_store.shipped_tokens(name)
    if shipped is None:
        return corpus_datastore(target)
    return cache_root() / "rest" / f"{name}-chat-{file_digest(shipped)[:12]}"


def build_default_datastore(target: Target, folder: Path) -> Path:
    """Build a zoo target's default datastore at ``folder`` (see :func:`default_datastore`)."""
    shipped = default_store.shipped_tokens(_zoo_name(target))
    if shipped is not None:
        return default_store.build_shipped(folder, shipped, target.vocab_size)
    return default_store.build_default(folder, target.tokenizer, target.vocab_size)


class RestDrafter(BaseDrafter):
    """Proposes the most frequent continuations of the longest matching suffix (see the config)."""

    auto_max_gamma = None  # auto drafts at most the continuation length
    batch_shared = ("datastore",)  # read-only and memory-mapped: a batch slot's copy reads the prototype's

    def __init__(
        self,
        target: Target | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        datastore: str | Path | None = None,
        min_span: int = 2,
        max_span: int = 16,
        continuation: int = 10,
        max_matches: int = 512,
        max_tree_size: int = 8,
    ) -> None:
        self.config = RestConfig(gamma, policy, datastore, min_span, max_span, continuation, max_matches,
                                 max_tree_size)
        self.default_gamma = continuation
        super().__init__(gamma, policy)
        self.stop: frozenset[int] = frozenset(target.eos_token_ids) if target is not None else frozenset()
        if datastore is None:
            if target is None:
                raise ValueError("rest needs a target or datastore=PATH")
            datastore = default_datastore(target)
            if not (datastore / "meta.json").is_file():  # first use for this zoo target: build it, once
                build_default_datastore(target, datastore)
        self.datastore = Datastore.open(datastore)
        if target is not None and self.datastore.vocab_size > target.vocab_size:
            raise ValueError(f"datastore {datastore} holds token ids < {self.datastore.vocab_size}; the target's "
                             f"vocabulary has {target.vocab_size}")

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.stop = frozenset(ctx.target.eos_token_ids)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        cfg, store = self.config, self.datastore
        span, positions = store.longest_match(ctx.tokens[-cfg.max_span :], cfg.min_span, cfg.max_span)
        paths = continuations(store.tokens, positions[: cfg.max_matches], span, min(gamma, cfg.continuation), self.stop)
        tokens, parents = frequent_tree(paths, cfg.max_tree_size)
        if not tokens:
            return Draft.empty()
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
