"""small_model: an independent draft LM sharing the target's tokenizer."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.small_model.config import SmallModelConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.small_model.drafter import SmallModelDrafter

    registry.register("small_model", SmallModelDrafter, config=SmallModelConfig,
                      description="independent small LM with the same tokenizer (Leviathan et al. 2022)")
