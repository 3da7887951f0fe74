"""prompt_lookup: copy what followed an earlier occurrence of the context's last n tokens."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.prompt_lookup.config import PromptLookupConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.prompt_lookup.drafter import PromptLookupDrafter

    registry.register("prompt_lookup", PromptLookupDrafter, config=PromptLookupConfig,
                      description="n-gram match of the context's last tokens in prompt + generated text (prompt "
                                  "lookup decoding)")
