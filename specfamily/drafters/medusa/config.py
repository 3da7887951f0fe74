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
        check_heads_options(self)
        if not isinstance(self.typical, bool):
            raise TypeError(f"typical must be a bool, got {type(self.typical).__name__}")
        if not (isinstance(self.epsilon, (int, float)) and 0 < self.epsilon <= 1):
            raise ValueError(f"epsilon must be in (0, 1], got {self.epsilon!r}")
        if self.delta is not None and not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta)
                                           and self.delta > 0):
            raise ValueError(f"delta must be a finite number > 0, got {self.delta!r}")


def check_heads_options(cfg) -> None:
    """The checks Medusa's and Hydra's options share: head count and blocks, gamma, share_lm_head, quantize, tree."""
    for name in ("num_heads", "layers"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if cfg.gamma is not None and (isinstance(cfg.gamma, bool) or not isinstance(cfg.gamma, int) or cfg.gamma < 1):
        raise ValueError(f"gamma must be an integer >= 1, got {cfg.gamma!r}")
    if not isinstance(cfg.share_lm_head, bool):
        raise TypeError(f"share_lm_head must be a bool, got {type(cfg.share_lm_head).__name__}")
    check_bits(cfg.quantize)
    if isinstance(cfg.tree, str) and cfg.tree != "chain":
        raise ValueError(f"tree must be None, 'chain' or a list of rank paths, got {cfg.tree!r}")
