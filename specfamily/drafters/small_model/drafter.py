"""An independent small LM with the target's vocabulary drafts a chain (Leviathan et al.; Chen et al.)."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specfamily.core.drafter import BaseDrafter
from specfamily.core.sampling import warp
from specfamily.core.target import Target, load_target
from specfamily.core.types import DecodeContext, Draft, VerifyOutcome

DEFAULT_DRAFT = "zoo:code-draft"


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


class SmallModelDrafter(BaseDrafter):
    """Samples gamma tokens from its own warped q (argmax at temperature 0) over its own KV cache."""

    default_gamma = 4

    def __init__(self, target: Target, model=None, gamma: int | None = None, policy: str = "constant", dtype=None):
        super().__init__(gamma, policy)
        source = DEFAULT_DRAFT if model is None else model
        self.draft = load_target(source, device=target.device, dtype=dtype or target.dtype).model
        if _vocab_size(self.draft) != target.vocab_size:
            raise ValueError(
                f"draft vocabulary ({_vocab_size(self.draft)}) differs from the target's ({target.vocab_size})"
            )
        self.cache = DynamicCache()
        self.cached = 0  # committed tokens whose keys/values are in self.cache
        self._base = 0  # committed length when the last draft was made
        self._gamma = 0

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.cache = DynamicCache()
        self.cached = 0

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        device = self.draft.device
        feed = torch.tensor(ctx.tokens[self.cached :], dtype=torch.long, device=device)
        tokens, qs = [], []
        for _ in range(gamma):
            logits = self.draft(input_ids=feed.view(1, -1), cache=self.cache, use_cache=True, logits_to_keep=1)
            logits = logits.logits[0, -1]
            if ctx.sampling.greedy:
                token = logits.argmax().view(1)
            else:
                q = warp(logits, ctx.sampling)
                token = torch.multinomial(q, 1, generator=ctx.generator)
                qs.append(q)
            tokens.append(token)
            feed = token
        self._base, self._gamma = len(ctx.tokens), gamma
        self.cached = self._base + gamma - 1
        return Draft.chain(torch.cat(tokens).cpu(), torch.stack(qs) if qs else None)

    def observe(self, outcome: VerifyOutcome) -> None:
        """Keep the cache up to the last accepted draft token it holds; drop the rest."""
        keep = self._base + min(len(outcome.accepted_nodes), self._gamma - 1)
        drop = self.cache.get_seq_length() - keep
        if drop > 0:
            self.cache.crop(-drop)
        self.cached = keep
