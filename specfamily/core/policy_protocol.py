"""The draft-length policy protocol and its optional hooks.

A policy answers ``next_gamma()`` before each proposal and takes each verification through ``update``; ``reset()``
starts a new request (:class:`Policy`). Optional hooks (declared on :class:`PolicyHooks`): ``bind(verify_cost)``
takes the target's measured verify-cost curve (asked for while the policy's ``verify_cost`` is None),
``timed(tokens, seconds)`` takes what each pass of the run really cost and ``describe()`` gives the policy's own
account for the metrics. :func:`policy_hooks` resolves them once per request, so a policy with only the three
required methods works unchanged and the loop probes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specfamily.core.theory import VerifyCost

__all__ = ["BoundHooks", "Policy", "PolicyHooks", "policy_hooks"]


@runtime_checkable
class Policy(Protocol):
    def reset(self) -> None:
        """Start a new request."""

    def next_gamma(self) -> int:
        """Draft length for the next proposal (>= 0: 0 is a plain pass; a drafter may propose fewer)."""

    def update(self, proposed: int, accepted: int, c: float | None = None, tokens: int | None = None,
               verified: int | None = None, overhead: float | None = None) -> None:
        """Report one verification: draft depth, draft tokens accepted, this pass's cost ratio c (one draft step's
        time over this verification pass's), the draft's token count (more than its depth for a tree), the levels
        the verifier tried, and the drafter's catch-up time over the verification's. An empty draft the drafter
        was asked for (``proposed`` 0) brings its proposal's time over the pass as c."""


class PolicyHooks(Protocol):
    """The optional hooks of a draft-length policy."""

    verify_cost: VerifyCost  # None until bound: the loop then measures the target's curve and calls bind

    def bind(self, verify_cost: VerifyCost) -> None:
        """Take t(g + 1) / t(1), the target's measured verify cost (a callable of g), before the first proposal."""

    def timed(self, tokens: int, seconds: float) -> None:
        """A pass over the root plus ``tokens`` draft tokens (0: plain) took ``seconds`` (forward, verification,
        commit), told before that pass's ``update``; not the prefill pass."""

    def describe(self) -> str:
        """The policy's own account of its decisions, kept in the metrics (``policy_note``)."""


@dataclass(frozen=True)
class BoundHooks:
    """A policy's optional hooks for one request: ``bind`` None when it wants no curve (or has one)."""

    bind: Callable[[VerifyCost], None] | None
    describe: Callable[[], str]
    timed: Callable[[int, float], None]


def _no_account() -> str:
    return ""


def _not_timed(tokens: int, seconds: float) -> None:
    pass


def policy_hooks(policy: Policy) -> BoundHooks:
    """The optional hooks of ``policy``, defaults (no curve wanted, no account, times unused) for those it lacks."""
    bind = getattr(policy, "bind", None)
    wants = callable(bind) and getattr(policy, "verify_cost", None) is None
    describe = getattr(policy, "describe", None)
    timed = getattr(policy, "timed", None)
    return BoundHooks(bind if wants else None, describe if callable(describe) else _no_account,
                      timed if callable(timed) else _not_timed)
