"""A drafter's draft-length policy continued across drafter objects of its class on one target.

A run that makes a fresh drafter for each call (a benchmark's rounds; a server building one per request, as
transformers' assisted generation keeps its assistant's draft length on the model across calls) would otherwise pay
a cold start every time: no draft cost measured, so its first pass drafts the start length, and acceptance learned
again from the prior. The last policy of each drafter class that ran on a target is kept beside the batched loop's
records (``Target.batch_realized``); a fresh drafter's policy with a ``resume`` hook continues from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specfamily.core.batch_kept import kept_record

__all__ = ["KeptPolicy", "continue_policy"]


@dataclass
class KeptPolicy:
    """The last policy of one drafter class that ran on a target (None: none yet)."""

    policy: object | None = None


def continue_policy(target, drafter) -> bool:
    """Before a request: ``drafter``'s policy resumes from the last one of its class on ``target`` (its ``resume``
    hook, which refuses once the policy has run or when their settings differ) and becomes the one kept. Returns
    whether it resumed."""
    kept = kept_record(target, drafter, "policy", KeptPolicy)
    policy = drafter.policy
    resume = getattr(policy, "resume", None)
    resumed = kept.policy is not None and callable(resume) and bool(resume(kept.policy))
    kept.policy = policy
    return resumed
