"""The Drafter protocol: the one interface every drafter implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from specfamily.core.context import DecodeContext
from specfamily.core.policy import Policy, make_policy
from specfamily.core.types import Draft, VerifyOutcome


@runtime_checkable
class Drafter(Protocol):
    """begin once per request, propose per step, observe what was committed, optional end.

    Class attributes the loop reads: ``needs_features`` (hand target features to ``observe``: True for the last
    hidden state after the final norm, or a tuple of layer ids for those layers' hidden states concatenated, as
    ``Target.forward`` takes them),
    ``lossy`` (results are marked lossy), ``policy`` (a draft-length Policy). A lossy drafter may
    define ``accept(draft, logits, sampling, generator) -> (accepted nodes, next token)``: the loop
    then uses it in place of the exact verifier (Medusa's typical acceptance).
    """

    needs_features: bool | tuple[int, ...]
    lossy: bool
    policy: Policy

    def begin(self, ctx: DecodeContext) -> None: ...

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft: ...

    def observe(self, outcome: VerifyOutcome) -> None: ...


def default_policy(gamma: int | None, policy: str | None) -> str:
    """The policy a drafter gets: the one named, else "auto" without a gamma and "constant" with one."""
    if policy is not None:
        return policy
    return "auto" if gamma is None else "constant"


class BaseDrafter:
    """Defaults for the protocol: no features, lossless, a draft-length policy from options."""

    needs_features: bool = False
    lossy: bool = False
    default_gamma: int = 4

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

    def observe(self, outcome: VerifyOutcome) -> None:
        pass

    def end(self) -> None:
        pass
