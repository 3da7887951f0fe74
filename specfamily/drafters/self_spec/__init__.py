"""self_spec: the target drafts for itself with a set of sub-layers skipped (Draft & Verify; SWIFT)."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.self_spec.config import SelfSpecConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.self_spec.drafter import SelfSpecDrafter

    registry.register("self_spec", SelfSpecDrafter, config=SelfSpecConfig,
                      description="the target with skipped layers drafts for itself over its own KV cache (Draft & "
                                  "Verify)")
