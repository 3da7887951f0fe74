"""A batched proposal's chains read to the host together: every slot's drawn tokens and q rows in one copy (on an
accelerator one wait a proposal, not one a slot): eagle's and eagle3's chains, small_model's, self_spec's."""

from __future__ import annotations

import torch

from specfamily.core.host import to_host
from specfamily.core.types import Draft

__all__ = ["chain_drafts"]


def chain_drafts(tokens: list[list[torch.Tensor]], qs: list[list[torch.Tensor]]) -> list[Draft]:
    """Slot b's chain from its drawn tokens ``tokens[b]`` (a (1,) tensor a step) and, when it sampled, their q rows
    ``qs[b]`` (empty at temperature 0: q None)."""
    n = len(tokens)
    host = to_host([torch.cat(steps) for steps in tokens] + [torch.stack(rows) if rows else None for rows in qs])
    return [Draft.chain(host[b], host[n + b]) for b in range(n)]
