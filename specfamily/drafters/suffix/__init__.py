"""suffix: SuffixDecoding's frequency-scored speculation trees from suffix indexes over this and earlier requests."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.suffix.config import SuffixConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.suffix.drafter import SuffixDrafter

    registry.register("suffix", SuffixDrafter, config=SuffixConfig,
                      description="suffix indexes over this request and earlier requests' outputs, frequency-scored "
                                  "speculation tree (SuffixDecoding)")
