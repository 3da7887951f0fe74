"""A drafter's batched proposal against its batch-1 ``propose``, at every pass of a real batched run.

``twin_check(monkeypatch, cls, target)`` wraps ``cls.propose_batch``: before each call, every slot gets a twin (a
``slot_copy`` of its drafter, its context with a clone of its generator) that proposes alone; after it, each slot's
batched draft must equal its twin's (tokens and parents exactly, q to ``atol``) and both must have consumed the same
draws from their generators. The returned log says what was compared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specfamily.core.batch_slots import slot_copy
from specfamily.core.types import Draft


@dataclass
class TwinLog:
    calls: int = 0  # propose_batch calls compared
    drafts: int = 0  # non-empty drafts compared
    sampled: int = 0  # of them with a q
    widest: int = 0  # most non-empty drafts in one call
    q_error: float = 0.0  # largest |q_batched - q_alone|


def _clone(generator: torch.Generator) -> torch.Generator:
    twin = torch.Generator(device=generator.device)
    twin.set_state(generator.get_state())
    return twin


def twin_check(monkeypatch, cls, target, atol: float = 1e-6) -> TwinLog:
    log = TwinLog()
    batched = cls.propose_batch

    def checked(self, drafters, ctxs, gammas):
        twins = [slot_copy(d, target) for d in drafters]
        twin_ctxs = [replace(c, generator=_clone(c.generator), tokens=list(c.tokens)) for c in ctxs]
        alone = [t.propose(c, g) if g > 0 else Draft.empty() for t, c, g in zip(twins, twin_ctxs, gammas, strict=True)]
        drafts = batched(self, drafters, ctxs, gammas)
        log.calls += 1
        log.widest = max(log.widest, sum(len(d) > 0 for d in drafts))
        for one, many, c, tc in zip(alone, drafts, ctxs, twin_ctxs, strict=True):
            assert many.tokens.tolist() == one.tokens.tolist() and many.parents.tolist() == one.parents.tolist()
            assert (many.q is None) == (one.q is None)
            if one.q is not None:
                log.q_error = max(log.q_error, float((many.q.double() - one.q.double()).abs().max()))
                log.sampled += 1
            assert torch.equal(c.generator.get_state(), tc.generator.get_state())  # the same draws, in order
            log.drafts += len(one) > 0
        assert log.q_error <= atol, log.q_error
        return drafts

    monkeypatch.setattr(cls, "propose_batch", checked)
    return log
