"""Options of the Medusa drafter."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specfamily.drafters.shared.quantize import check_bits


@dataclass
class MedusaConfig:
    weights: Any = None  # a checkpoint folder, a zoo: name or "random"; None = the zoo's heads for this target
    gamma: int | None = None  # tree depth cap (default: the tree's depth, at most the number of heads)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    tree: Any = None  # None = the checkpoint's calibrated tree, "chain" = top-1 chain, or a list of rank paths
    num_heads: int = 4  # K, for weights="random"
    layers: int = 1  # residual blocks per head, for weights="random"
    share_lm_head: bool = False  # project with the target's LM head instead of per-head copies, for "random"
    typical: bool = False  # Medusa's typical acceptance: LOSSY, every result is marked lossy=True (rule: .accept)
    epsilon: float = 0.09  # typical acceptance: hard threshold
    delta: float | None = None  # typical acceptance: entropy-scaled threshold (default sqrt(epsilon))
    quantize: int = 0  # 8: the heads (and a shared LM head) with int8 weights (specfamily.drafters.shared.quantize)

    def __post_init__(self) -> None:
        for name in ("num_heads", "layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.gamma is not None and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                       or self.gamma < 1):
            raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
        for name in ("share_lm_head", "typical"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not (isinstance(self.epsilon, (int, float)) and 0 < self.epsilon <= 1):
            raise ValueError(f"epsilon must be in (0, 1], got {self.epsilon!r}")
        if self.delta is not None and not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta)
                                           and self.delta > 0):
            raise ValueError(f"delta must be a finite number > 0, got {self.delta!r}")
        check_bits(self.quantize)
        if isinstance(self.tree, str) and self.tree != "chain":
            raise ValueError(f"tree must be None, 'chain' or a list of rank paths, got {self.tree!r}")
