"""recycling: Token Recycling's adjacency table of the target's own top-k successors, grown into a static tree."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.recycling.config import RecyclingConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.recycling.drafter import RecyclingDrafter

    registry.register("recycling", RecyclingDrafter, config=RecyclingConfig,
                      description="the target's own top-k successors from earlier passes (an adjacency table), "
                                  "grown into a static token tree (Token Recycling)")
