"""Hydra checkpoints: Medusa's layout (``model.safetensors`` + ``config.json`` with shape, target identity, tree)
under their own format name, so neither family loads the other's heads by mistake."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specfamily.drafters.medusa.checkpoint import CONFIG_FILE, DRAFT_IDS, WEIGHTS_FILE, MedusaCheckpoint, resolve
from specfamily.drafters.medusa.heads import HeadsShape
from specfamily.drafters.medusa.hydra_heads import HydraHeads, build_hydra
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.io.files import write_folder_atomically
from specfamily.io.identity import check_identity

FORMAT = "specfamily-hydra"
VERSION = 1


def save_hydra(folder: str | Path, heads: HydraHeads, meta: MedusaCheckpoint, dtype: torch.dtype | None = None) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` (floats cast to ``dtype``; ids stay int64)."""
    tensors = {k: v.detach().to("cpu", dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous()
               for k, v in heads.state_dict().items()}
    config = {**meta.to_json(), "format": FORMAT, "version": VERSION}

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": FORMAT})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")

    return write_folder_atomically(folder, fill)


def read_hydra(folder: Path) -> MedusaCheckpoint:
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"no Hydra checkpoint at {folder} (missing {CONFIG_FILE})")
    raw = json.loads(config_file.read_text())
    if raw.get("format") != FORMAT:
        raise ValueError(f"{config_file} is not a Hydra checkpoint (format {raw.get('format')!r}, want {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise ValueError(f"{config_file} has checkpoint version {raw.get('version')!r}; this code reads {VERSION}")
    return MedusaCheckpoint(HeadsShape(**raw["shape"]), raw["target"], raw.get("tree"),
                            raw.get("calibration") or {}, raw.get("training") or {})


def load_hydra(weights: str | Path, target) -> tuple[HydraHeads, MedusaCheckpoint]:
    """Hydra heads for ``target`` from a checkpoint folder or zoo name; heads for another target are refused."""
    folder = resolve(weights)
    meta = read_hydra(folder)
    check_identity(meta.target, target.model, f"Hydra heads at {folder}",
                   "train heads for this target with `python -m specfamily.drafters.medusa.hydra_train`")
    state = load_file(str(folder / WEIGHTS_FILE), device=str(target.device))
    ids = state.get(DRAFT_IDS)
    if meta.shape.draft_vocab and ids is None:
        raise ValueError(f"{folder / WEIGHTS_FILE} lacks the {DRAFT_IDS} of its draft_vocab={meta.shape.draft_vocab}")
    vocab = DraftVocab(ids.cpu(), meta.shape.vocab_size) if meta.shape.draft_vocab else None
    heads = build_hydra(target, meta.shape, vocab)
    expected = heads.state_dict()
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"{folder / WEIGHTS_FILE} does not match its config: missing {missing}, unexpected {extra}")
    heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return heads.eval(), meta
