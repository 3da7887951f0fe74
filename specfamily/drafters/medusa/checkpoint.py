"""Medusa checkpoints: ``model.safetensors`` (the heads) + ``config.json`` (shape, target identity, tree).

Heads over a reduced draft vocabulary also save its target ids (``draft_ids``, int64) and ``draft_vocab: N`` in the
shape; without them a checkpoint drafts over the full vocabulary. Heads are refused for a target other than the one
recorded (``specfamily.io.identity``). Folders are written atomically. ``load_checkpoint`` also reads the Medusa
repository's layout (``specfamily.drafters.medusa.formats``), from a folder or a model-hub name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specfamily import zoo
from specfamily.drafters.medusa.formats import is_medusa_repo, load_medusa_repo
from specfamily.drafters.medusa.heads import HeadsShape, MedusaHeads, build_heads
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.io.files import write_folder_atomically
from specfamily.io.hub import resolve_source
from specfamily.io.identity import check_identity

FORMAT = "specfamily-medusa"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
DRAFT_IDS = "draft_ids"  # the draft vocabulary's target ids (MedusaHeads' buffer), when the heads have one


@dataclass
class MedusaCheckpoint:
    """Everything in ``config.json``."""

    shape: HeadsShape
    target: dict[str, Any]  # specfamily.io.identity.target_identity of the target the heads were trained for
    tree: list[list[int]] | None = None  # the default tree (rank paths) chosen at calibration
    calibration: dict[str, Any] = field(default_factory=dict)  # accuracies, cost curve, c, tau
    training: dict[str, Any] = field(default_factory=dict)  # step, data, options

    def to_json(self) -> dict[str, Any]:
        shape = asdict(self.shape)
        if not shape["draft_vocab"]:
            del shape["draft_vocab"]  # full-vocabulary checkpoints read as before
        return {"format": FORMAT, "version": VERSION, "shape": shape, "target": self.target,
                "tree": self.tree, "calibration": self.calibration, "training": self.training}


def save_checkpoint(folder: str | Path, heads: MedusaHeads, meta: MedusaCheckpoint,
                    dtype: torch.dtype | None = None) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` (weights cast to ``dtype`` if given; the
    draft vocabulary's ids stay int64)."""
    tensors = {k: v.detach().to("cpu", dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous()
               for k, v in heads.state_dict().items()}

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": FORMAT})
        (tmp / CONFIG_FILE).write_text(json.dumps(meta.to_json(), indent=1) + "\n")

    return write_folder_atomically(folder, fill)


def resolve(weights: str | Path) -> Path:
    """A checkpoint folder from a path or a ``zoo:`` name."""
    if zoo.is_zoo_name(weights):
        return zoo.resolve(weights)
    if not isinstance(weights, (str, Path)):
        raise TypeError(f"weights must be a path, a zoo: name or 'random', got {type(weights).__name__}")
    return resolve_source(weights)


def read_checkpoint(folder: Path) -> MedusaCheckpoint:
    """Parse ``config.json`` of a checkpoint folder."""
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"no Medusa checkpoint at {folder} (missing {CONFIG_FILE})")
    raw = json.loads(config_file.read_text())
    if raw.get("format") != FORMAT:
        raise ValueError(f"{config_file} is not a Medusa checkpoint (format {raw.get('format')!r}, want {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise ValueError(f"{config_file} has checkpoint version {raw.get('version')!r}; this code reads {VERSION}")
    return MedusaCheckpoint(HeadsShape(**raw["shape"]), raw["target"], raw.get("tree"),
                            raw.get("calibration") or {}, raw.get("training") or {})


def load_checkpoint(weights: str | Path, target) -> tuple[MedusaHeads, MedusaCheckpoint]:
    """Heads for ``target`` from a checkpoint folder or zoo name; a checkpoint for another target is refused."""
    folder = resolve(weights)
    if (folder / CONFIG_FILE).is_file() and is_medusa_repo(json.loads((folder / CONFIG_FILE).read_text())):
        heads = load_medusa_repo(folder, target)
        return heads, MedusaCheckpoint(heads.shape, {})
    meta = read_checkpoint(folder)
    check_identity(meta.target, target.model, f"Medusa heads at {folder}",
                   "train heads for this target with `python -m specfamily.drafters.medusa.train`")
    state = load_file(str(folder / WEIGHTS_FILE), device=str(target.device))
    heads = build_heads(target, meta.shape, _draft_vocab(state, meta.shape, folder))
    expected = heads.state_dict()
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"{folder / WEIGHTS_FILE} does not match its config: missing {missing}, unexpected {extra}")
    heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return heads.eval(), meta


def _draft_vocab(state: dict[str, torch.Tensor], shape: HeadsShape, folder: Path) -> DraftVocab | None:
    """The draft vocabulary saved with the weights (None for full-vocabulary heads)."""
    ids = state.get(DRAFT_IDS)
    if ids is None or not shape.draft_vocab:
        if shape.draft_vocab:
            raise ValueError(f"{folder / WEIGHTS_FILE} lacks the {DRAFT_IDS} of its draft_vocab={shape.draft_vocab}")
        return None  # an id tensor without draft_vocab in the shape is reported as an unexpected key below
    if ids.dtype != torch.int64:
        raise ValueError(f"{folder / WEIGHTS_FILE}: {DRAFT_IDS} must be int64, got {ids.dtype}")
    return DraftVocab(ids.cpu(), shape.vocab_size)
