"""rest: REST's retrieval from a datastore of text (a suffix array on disk) into a frequent-continuation tree."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.rest.config import RestConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.rest.drafter import RestDrafter

    registry.register("rest", RestDrafter, config=RestConfig,
                      description="the most frequent continuations of the context's longest matching suffix in a "
                                  "datastore of text (REST)")
