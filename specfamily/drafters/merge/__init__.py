"""merge: several drafters' proposals as one token tree (SpecInfer's merged tree; SAM-Decoding merges a suffix
automaton with EAGLE-2), verified by the shared tree verifier.

Usage::

    drafter = sf.create_drafter("merge", target, parts=["suffix", "eagle3"], options={"eagle3": {"total_tokens": 8}})
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.merge.config import MergeConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.merge.drafter import MergeDrafter

    registry.register("merge", MergeDrafter, config=MergeConfig,
                      description="several drafters' trees merged into one token tree, shared prefixes once, each "
                                  "node with the q it was drawn from (SpecInfer; SAM-Decoding: suffix + EAGLE)")
