"""Hydra checkpoints: Medusa's layout and functions (``checkpoint``) under their own format name, so neither family
loads the other's heads by mistake. Version 2: the slim grounding blocks and the shared prefix projection
(``hydra_heads``); version 1 (two full matrices per head) is refused by its version."""

from __future__ import annotations

from pathlib import Path

import torch

from specfamily.drafters.medusa.checkpoint import (
    HeadsFormat,
    MedusaCheckpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from specfamily.drafters.medusa.hydra_heads import HydraHeads, HydraShape, build_hydra

FORMAT = "specfamily-hydra"
VERSION = 2
HYDRA = HeadsFormat("Hydra", FORMAT, VERSION, HydraShape, build_hydra, "specfamily.drafters.medusa.hydra_train")


def save_hydra(folder: str | Path, heads: HydraHeads, meta: MedusaCheckpoint, dtype: torch.dtype | None = None) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` (floats cast to ``dtype``; ids stay int64)."""
    return save_checkpoint(folder, heads, meta, dtype, HYDRA)


def read_hydra(folder: Path) -> MedusaCheckpoint:
    """Parse ``config.json`` of a Hydra checkpoint folder."""
    return read_checkpoint(folder, HYDRA)


def load_hydra(weights: str | Path, target) -> tuple[HydraHeads, MedusaCheckpoint]:
    """Hydra heads for ``target`` from a checkpoint folder or zoo name; heads for another target are refused."""
    return load_checkpoint(weights, target, HYDRA)
