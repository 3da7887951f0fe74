"""What a drafter sees of a request: the target, the prompt, the sampling settings, the generator and the tokens
committed so far (above ``types``, which knows no target)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specfamily.core.types import SamplingConfig

if TYPE_CHECKING:
    from specfamily.core.target import Target


@dataclass
class DecodeContext:
    """Per-request state a drafter may read: the committed tokens grow as the loop commits."""

    target: Target
    prompt_ids: torch.Tensor  # (L,) long
    sampling: SamplingConfig
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)  # prompt + committed new tokens
