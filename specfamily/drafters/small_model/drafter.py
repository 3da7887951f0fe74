"""An independent small LM with the target's vocabulary drafts a chain (Leviathan et al.; Chen et al.)."""

from __future__ import annotations

import torch

from specfamily import zoo
from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock
from specfamily.core.drafter import BaseDrafter
from specfamily.core.host import draw
from specfamily.core.sampling import greedy_tokens, warp
from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.shared.quantize import Int8Linears, causal_lm_linears, check_bits
from specfamily.drafters.small_model.batched import CATCH_UP_TOKENS, propose_small_batch
from specfamily.runtime.lean import LeanLlama


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


class SmallModelDrafter(BaseDrafter):
    """Samples gamma tokens from its own warped q (argmax at temperature 0) over its own KV cache.

    The draft model runs through a :class:`Target` of its own: the same lean forward and in-place KV buffer as
    the target, one token per call, rolled back to the accepted tokens after each verification. With
    ``confidence`` > 0 a draft ends early after a token whose draft probability is below it (transformers'
    ``assistant_confidence_threshold``, fixed here rather than adapted). ``quantize=8`` runs the draft's linear
    layers (its LM head included) with int8 weights through the same lean forward; q is the quantized draft's.
    """

    default_gamma = 4

    def __init__(self, target: Target, model=None, gamma: int | None = None, policy: str | None = None, dtype=None,
                 confidence: float = 0.0, quantize: int = 0):
        if not 0.0 <= confidence < 1.0:
            raise ValueError(f"confidence must be in [0, 1), got {confidence}")
        self.quantize = check_bits(quantize)
        super().__init__(gamma, policy)
        self.confidence = confidence
        source = zoo.default_weights("draft", target) if model is None else model  # the zoo's draft for it
        self.runner = load_target(source, device=target.device, dtype=dtype or target.dtype, matmul=target.matmul)
        self.draft = self.runner.model
        if _vocab_size(self.draft) != target.vocab_size:
            raise ValueError(
                f"draft vocabulary ({_vocab_size(self.draft)}) differs from the target's ({target.vocab_size})"
            )
        if self.quantize:
            _quantize_runner(self.runner)
        _warm_up(self.runner)
        self._base = 0  # committed length when the last draft was made
        self._gamma = 0

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.runner.reset()
        self._base = self._gamma = 0  # the last request's last draft was never observed (the loop ends before)

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        runner = self.runner
        feed = torch.tensor(ctx.tokens[runner.cached_length :], dtype=torch.long, device=runner.device)
        catch_up = 0.0
        if len(feed) > CATCH_UP_TOKENS:  # a backlog (the prompt, or tokens committed while it drafted nothing)
            clock = device_clock(runner.device)
            start = clock()
            runner.forward(feed[:-1])
            runner.commit([])
            feed, catch_up = feed[-1:], clock() - start
        tokens, qs = [], []
        for _ in range(gamma):
            logits = runner.forward(feed).logits[-1]
            runner.commit([])
            if ctx.sampling.greedy:
                token = greedy_tokens(logits).view(1)
                sure = self.confidence == 0.0 or torch.softmax(logits.float(), -1)[token].item() >= self.confidence
            else:
                q = warp(logits, ctx.sampling)
                token = draw(q, ctx.generator)
                qs.append(q)
                sure = self.confidence == 0.0 or q[token].item() >= self.confidence
            tokens.append(token)
            feed = token
            if not sure:  # the draft doubts this token: stop here (the draft length depends on q only: lossless)
                break
        self._base, self._gamma = len(ctx.tokens), len(tokens)
        draft = Draft.chain(torch.cat(tokens).cpu(), torch.stack(qs) if qs else None)
        draft.catch_up_seconds = catch_up
        return draft

    @torch.inference_mode()
    def propose_batch(self, drafters: list, ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """Batched decoding: one draft-model forward per draft step for every slot (``batched.py``); slots of
        another drafter or draft model fall back to their own ``propose``."""
        if not all(isinstance(d, SmallModelDrafter) and d.draft is self.draft and d.quantize == self.quantize
                   and d.confidence == self.confidence for d in drafters):
            return super().propose_batch(drafters, ctxs, gammas)
        return propose_small_batch(drafters, ctxs, gammas, self.confidence)

    def observe(self, outcome: VerifyOutcome) -> None:
        """Keep the cache up to the last accepted draft token it holds; drop the rest. A proposal the pass fed
        shorter or not at all (the batched plan cuts drafts it has seen) accepted at most what was fed, so the same
        rule drops its unfed tokens; after a pass it proposed nothing for, its cache holds only committed tokens."""
        if self._gamma:
            self.runner.rollback(self._base + min(len(outcome.accepted_nodes), self._gamma - 1))
        self._gamma = 0


@torch.inference_mode()
def _warm_up(runner: Target) -> None:
    """One forward at load time: a fresh draft model's first forward costs ~60 ms more than the next (memory its
    forward touches for the first time: ~25k page faults for SmolLM2's draft, measured in docs/policy-costs.md,
    session 25), which a request would otherwise pay inside its first draft and the policy would measure as its
    start cost."""
    runner.reset()
    runner.forward(torch.zeros(1, dtype=torch.long, device=runner.device))
    runner.reset()


def _quantize_runner(runner: Target) -> None:
    """Rebuild the draft's lean forward over int8 copies of its linear weights (the float model stays as it is)."""
    if runner.lean is None:
        raise ValueError("quantize=8 needs the lean forward for the draft model (a Llama/Mistral/Qwen2 causal LM "
                         "with sdpa attention); this draft runs transformers' own forward")
    runner.lean = LeanLlama(runner.model, Int8Linears(causal_lm_linears(runner.model)))
