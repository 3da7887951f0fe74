"""lookahead: Jacobi iteration over a window of guesses in side rows, an n-gram pool, its candidates verified."""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.lookahead.config import LookaheadConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.lookahead.drafter import LookaheadDrafter

    registry.register("lookahead", LookaheadDrafter, config=LookaheadConfig,
                      description="lookahead decoding: a Jacobi window in the target's own pass fills an n-gram "
                                  "pool whose candidates are verified in the same pass (Fu et al. 2024)")
