"""The Drafter protocol: the one interface every drafter implements, its optional hooks and their defaults.

Required: ``begin``, ``propose``, ``observe`` and the attributes ``needs_features``, ``lossy``, ``policy``.
Optional (declared on :class:`DrafterHooks`, defaults on :class:`BaseDrafter`): ``end()`` after each request, and
``accept`` (a lossy drafter's own acceptance rule); for batched decoding ``propose_batch`` and ``observe_batch``
(BaseDrafter's defaults loop over each slot's ``propose`` and ``observe``) and ``batch_shared``. :func:`hooks`
resolves them once per request, so a drafter that implements only the required protocol gets the defaults and the
loop never probes for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.policy import Policy, make_policy
from specfamily.core.types import Draft, SamplingConfig, VerifyOutcome

AcceptRule = Callable[[Draft, torch.Tensor, SamplingConfig, torch.Generator], tuple[list[int], int]]


@runtime_checkable
class Drafter(Protocol):
    """begin once per request, propose per step, observe what was committed, optional end.

    Class attributes the loop reads: ``needs_features`` (hand target features to ``observe``: True for the last
    hidden state after the final norm, or a tuple of layer ids for those layers' hidden states concatenated, as
    ``Target.forward`` takes them), ``lossy`` (results are marked lossy), ``policy`` (a draft-length Policy).
    The optional hooks are on :class:`DrafterHooks`.
    """

    needs_features: bool | tuple[int, ...]
    lossy: bool
    policy: Policy

    def begin(self, ctx: DecodeContext) -> None: ...

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft: ...

    def observe(self, outcome: VerifyOutcome) -> None: ...


class DrafterHooks(Protocol):
    """The optional hooks (BaseDrafter's defaults: ``end`` does nothing, ``accept`` is None, the exact verifier)."""

    def end(self) -> None:
        """After each request, however it ended (also after an error)."""

    def accept(self, draft: Draft, logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator) -> tuple[list[int], int]:
        """A lossy drafter's acceptance rule, in place of the exact verifier: logits (n + 1, V) as the target
        returned them -> (accepted node indices from the root down, next token). Read only when ``lossy``."""


@dataclass(frozen=True)
class Hooks:
    """A drafter's optional hooks for one request: its own, or BaseDrafter's defaults."""

    end: Callable[[], None]
    accept: AcceptRule | None  # a lossy drafter's own rule; None: the exact verifier


def _nothing() -> None:
    pass


def hooks(drafter: Drafter) -> Hooks:
    """The optional hooks of ``drafter`` with the defaults for those it leaves out (``accept`` only when lossy)."""
    end = getattr(drafter, "end", None)
    accept = getattr(drafter, "accept", None) if drafter.lossy else None
    return Hooks(end if callable(end) else _nothing, accept if callable(accept) else None)


def drafter_name(drafter: Drafter | None) -> str:
    """The drafter's class, as errors name it (a wrapper names the drafter it wraps, e.g. the kit's recorder)."""
    inner = drafter
    while hasattr(inner, "inner"):  # wrappers that forward the protocol (specfamily.testing.DepthRecorder)
        inner = inner.inner
    return f"drafter {type(inner).__name__}"


def default_policy(gamma: int | None, policy: str | None) -> str:
    """The policy a drafter gets: the one named, else "auto" without a gamma and "constant" with one."""
    if policy is not None:
        return policy
    return "auto" if gamma is None else "constant"


class BaseDrafter:
    """Defaults for the protocol and its hooks: no features, lossless, the exact verifier, a draft-length policy from
    options, nothing to do at the end."""

    needs_features: bool = False
    lossy: bool = False
    accept: AcceptRule | None = None  # a lossy drafter defines ``accept`` as a method (DrafterHooks.accept)
    default_gamma: int = 4

    batch_shared: tuple[str, ...] = ()  # attributes every batch slot's copy shares with the prototype (slot_copy)
    auto_max_gamma: int | None = 16  # the most "auto" drafts; None: the default gamma (calibrated tree depths)

    def __init__(self, gamma: int | None = None, policy: str | None = None) -> None:
        """No policy: "auto" (cost-aware, may draft nothing) when gamma is not given, else "constant" gamma."""
        policy = default_policy(gamma, policy)
        start = self.default_gamma if gamma is None else gamma
        options = {}
        if policy == "auto":
            options["max_gamma"] = max(start, self.auto_max_gamma or start)
        self.policy = make_policy(policy, start, **options)

    def begin(self, ctx: DecodeContext) -> None:
        self.policy.reset()

    def propose_batch(self, drafters: list[Drafter], ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """Batched decoding (``core.batch_slots``), called on the prototype with each slot's own copy: each slot's
        draft of ``gammas[i]`` tokens. This default loops over the slots' ``propose``; a family with a model of its
        own overrides it with one draft forward per step for the whole batch."""
        return [drafter.propose(ctx, gamma) if gamma > 0 else Draft.empty()
                for drafter, ctx, gamma in zip(drafters, ctxs, gammas, strict=True)]

    def observe_batch(self, drafters: list[Drafter], outcomes: list[VerifyOutcome]) -> None:
        """Batched decoding, after a pass: each slot's copy observes its outcome (called on the prototype, slots in
        order). This default loops over the slots' ``observe``; a drafter whose observation computes over the
        pass's logits or features may do it for every slot at once (Token Recycling's table)."""
        for drafter, outcome in zip(drafters, outcomes, strict=True):
            drafter.observe(outcome)

    def observe(self, outcome: VerifyOutcome) -> None:
        pass

    def end(self) -> None:
        pass
