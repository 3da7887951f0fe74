"""Options of the small-model drafter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SmallModelConfig:
    model: Any = None  # a PreTrainedModel, a folder, a hub name or a zoo: name; None = the zoo's draft for this target
    gamma: int | None = None  # draft length (default 4)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    dtype: Any = None  # torch dtype for a model loaded by name (default: the target's)
    confidence: float = 0.0  # end a draft after a token the draft gives less than this probability; 0 = never
    quantize: int = 0  # 8: run the draft with int8 weights (specfamily.drafters.shared.quantize); 0: as loaded
