"""Medusa checkpoints: ``model.safetensors`` (the heads) + ``config.json`` (shape, target identity, tree).

Heads over a reduced draft vocabulary also save its target ids (``draft_ids``, int64) and ``draft_vocab: N`` in the
shape; without them a checkpoint drafts over the full vocabulary. Heads are refused for a target other than the one
recorded (``specfamily.io.identity``). Folders are written atomically. ``load_checkpoint`` also reads the Medusa
repository's layout (``specfamily.drafters.medusa.formats``), from a folder or a model-hub name.

The functions take the heads' :class:`HeadsFormat` (Medusa's by default): Hydra's heads are saved the same way under
their own format name (``hydra_checkpoint``), so neither family loads the other's heads by mistake.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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


@dataclass(frozen=True)
class HeadsFormat:
    """What tells one family's head checkpoints from another's: the name in messages, the format and version in
    ``config.json``, the shape class, how fresh heads are built and the trainer named in hints."""

    name: str  # "Medusa"
    format: str
    version: int
    shape: type
    build: Callable  # (target, shape, vocab) -> heads
    trainer: str  # the module that trains such heads
    reads_medusa_repo: bool = False  # also load the Medusa repository's layout


MEDUSA = HeadsFormat("Medusa", FORMAT, VERSION, HeadsShape, build_heads, "specfamily.drafters.medusa.train", True)


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
                    dtype: torch.dtype | None = None, kind: HeadsFormat = MEDUSA) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` (weights cast to ``dtype`` if given; the
    draft vocabulary's ids stay int64)."""
    tensors = {k: v.detach().to("cpu", dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous()
               for k, v in heads.state_dict().items()}
    config = {**meta.to_json(), "format": kind.format, "version": kind.version}

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": kind.format})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")

    return write_folder_atomically(folder, fill)


def resolve(weights: str | Path) -> Path:
    """A checkpoint folder from a path or a ``zoo:`` name."""
    if zoo.is_zoo_name(weights):
        return zoo.resolve(weights)
    if not isinstance(weights, (str, Path)):
        raise TypeError(f"weights must be a path, a zoo: name or 'random', got {type(weights).__name__}")
    return resolve_source(weights)


def read_checkpoint(folder: Path, kind: HeadsFormat = MEDUSA) -> MedusaCheckpoint:
    """Parse ``config.json`` of a checkpoint folder."""
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(f"no {kind.name} checkpoint at {folder} (missing {CONFIG_FILE})")
    raw = json.loads(config_file.read_text())
    if raw.get("format") != kind.format:
        raise ValueError(f"{config_file} is not a {kind.name} checkpoint (format {raw.get('format')!r}, want "
                         f"{kind.format!r})")
    if raw.get("version") != kind.version:
        raise ValueError(f"{config_file} has checkpoint version {raw.get('version')!r}; this code reads {kind.version}")
    return MedusaCheckpoint(kind.shape(**raw["shape"]), raw["target"], raw.get("tree"),
                            raw.get("calibration") or {}, raw.get("training") or {})


def load_checkpoint(weights: str | Path, target, kind: HeadsFormat = MEDUSA) -> tuple[MedusaHeads, MedusaCheckpoint]:
    """Heads for ``target`` from a checkpoint folder or zoo name; a checkpoint for another target is refused."""
    folder = resolve(weights)
    config_file = folder / CONFIG_FILE
    if kind.reads_medusa_repo and config_file.is_file() and is_medusa_repo(json.loads(config_file.read_text())):
        heads = load_medusa_repo(folder, target)
        return heads, MedusaCheckpoint(heads.shape, {})
    meta = read_checkpoint(folder, kind)
    check_identity(meta.target, target.model, f"{kind.name} heads at {folder}",
                   f"train heads for this target with `python -m {kind.trainer}`")
    state = load_file(str(folder / WEIGHTS_FILE), device=str(target.device))
    heads = kind.build(target, meta.shape, _draft_vocab(state, meta.shape, folder))
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
