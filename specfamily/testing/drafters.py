"""Test-only drafters (not registered by default): oracle, deliberately wrong, random tree."""

from __future__ import annotations

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.sampling import warp
from specfamily.core.types import Draft


class OracleDrafter(BaseDrafter):
    """Replays the target's own greedy continuation (alpha = 1 under greedy): the loop's ceiling."""

    default_gamma = 8

    def __init__(self, target=None, gamma: int | None = None, policy: str = "constant", horizon: int = 1024):
        super().__init__(gamma, policy)
        self.horizon = horizon
        self.continuation: list[int] = []

    @torch.inference_mode()
    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        model = ctx.target.model
        ids = ctx.prompt_ids.view(1, -1).to(model.device)
        limit = min(self.horizon, model.config.max_position_embeddings - ids.shape[1])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max(limit, 1),
            pad_token_id=ctx.target.eos_token_id if ctx.target.eos_token_id is not None else 0,
        )
        self.continuation = ctx.prompt_ids.tolist() + out[0, ids.shape[1] :].tolist()

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        position = len(ctx.tokens)
        return Draft.chain(self.continuation[position : position + gamma])


class WrongDrafter(BaseDrafter):
    """Samples from uniform q but reports a different, skewed q: the conformance suite must reject it."""

    default_gamma = 2

    def __init__(self, target=None, gamma: int | None = None, policy: str = "constant"):
        super().__init__(gamma, policy)

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        vocab = ctx.target.vocab_size
        tokens = torch.randint(0, vocab, (gamma,), generator=ctx.generator, device=ctx.generator.device)
        skewed = torch.arange(vocab, 0, -1, dtype=torch.float64)
        reported = (skewed / skewed.sum()).expand(gamma, vocab)
        return Draft.chain(tokens.cpu(), reported.clone())


class RandomTreeDrafter(BaseDrafter):
    """Random token trees: deterministic distinct siblings (q = None) or siblings sampled i.i.d. from a random q.

    The tree has ``nodes`` nodes, depth at most gamma. Sampled mode reports for each child the
    warped q of its parent's slot it was drawn from, so the verifier stays exact.
    """

    default_gamma = 3

    def __init__(self, target=None, gamma: int | None = None, policy: str = "constant", nodes: int = 6,
                 sampled: bool = False):
        super().__init__(gamma, policy)
        self.nodes, self.sampled = nodes, sampled

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        seed = torch.randint(0, 2**31, (1,), generator=ctx.generator, device=ctx.generator.device)
        gen = torch.Generator().manual_seed(int(seed))
        parents, depth = [], []  # random parents; a node deeper than gamma moves up to the root
        for i in range(self.nodes):
            parent = int(torch.randint(-1, i, (1,), generator=gen)) if i else -1
            d = 1 if parent < 0 else depth[parent] + 1
            parents.append(parent if d <= gamma else -1)
            depth.append(d if d <= gamma else 1)
        vocab = ctx.target.vocab_size
        if self.sampled and not ctx.sampling.greedy:
            return self._sampled(parents, vocab, ctx, gen)
        return self._deterministic(parents, vocab, gen)

    def _deterministic(self, parents: list[int], vocab: int, gen: torch.Generator) -> Draft:
        tokens: list[int] = []
        used: dict[int, set[int]] = {}
        kept_parents: list[int] = []
        index_of: dict[int, int] = {}
        for i, parent in enumerate(parents):
            if parent >= 0 and parent not in index_of:
                continue  # its parent was dropped
            siblings = used.setdefault(parent, set())
            free = [t for t in range(vocab) if t not in siblings]
            if not free:
                continue
            token = free[int(torch.randint(0, len(free), (1,), generator=gen))]
            siblings.add(token)
            index_of[i] = len(tokens)
            tokens.append(token)
            kept_parents.append(-1 if parent < 0 else index_of[parent])
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(kept_parents, dtype=torch.long))

    def _sampled(self, parents: list[int], vocab: int, ctx: DecodeContext, gen: torch.Generator) -> Draft:
        slot_q: dict[int, torch.Tensor] = {}
        tokens, qs = [], []
        for parent in parents:
            if parent not in slot_q:
                logits = torch.randn(vocab, generator=gen, dtype=torch.float64) * 2
                slot_q[parent] = warp(logits, ctx.sampling).double()
            q = slot_q[parent]
            tokens.append(int(torch.multinomial(q, 1, generator=gen)))
            qs.append(q)
        return Draft(torch.tensor(tokens), torch.tensor(parents), torch.stack(qs))
