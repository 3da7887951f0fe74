"""Options of the Hydra drafter: Medusa's, without typical acceptance (Hydra here is exact only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specfamily.drafters.medusa.config import check_heads_options
from specfamily.drafters.medusa.hydra_heads import PREFIX_RANK


@dataclass
class HydraConfig:
    weights: Any = None  # a checkpoint folder, a zoo: name or "random"; None = the zoo's heads for this target
    gamma: int | None = None  # tree depth cap (default: the tree's depth, at most the number of heads)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    tree: Any = None  # None = the checkpoint's calibrated tree, "chain" = top-1 chain, or a list of rank paths
    num_heads: int = 4  # K, for weights="random"
    layers: int = 1  # blocks per head (the grounding block included), for weights="random"
    share_lm_head: bool = False  # project with the target's LM head instead of per-head copies, for "random"
    quantize: int = 0  # 8: the heads (and a shared LM head) with int8 weights (specfamily.drafters.shared.quantize)
    prefix_rank: int = PREFIX_RANK  # r: width of the shared projection of each prefix token, for weights="random"

    def __post_init__(self) -> None:
        check_heads_options(self)
        if isinstance(self.prefix_rank, bool) or not isinstance(self.prefix_rank, int) or self.prefix_rank < 1:
            raise ValueError(f"prefix_rank must be an integer >= 1, got {self.prefix_rank!r}")
