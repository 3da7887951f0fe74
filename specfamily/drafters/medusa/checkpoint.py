"""Medusa checkpoints: ``model.safetensors`` (the heads) + ``config.json`` (shape, target identity, tree).

The target identity is a hash of the target's model config (volatile keys left out) plus a probe of its LM head
weights, so heads trained for one target are refused for another, even one with the same architecture.
A checkpoint folder is written next to its final place and swapped in, so nothing half-written is ever read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specfamily.drafters.medusa.heads import HeadsShape, MedusaHeads, build_heads

FORMAT = "specfamily-medusa"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_VOLATILE_KEYS = {
    "_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version", "_attn_implementation",
    "_attn_implementation_autoset", "use_cache", "output_hidden_states", "output_attentions", "return_dict",
}
_PROBE_SIZE = 64
_PROBE_RTOL = 1e-2
_PROBE_ATOL = 1e-3


@dataclass
class TargetIdentity:
    """Which target a set of heads was trained for."""

    model_type: str
    config_hash: str  # sha256 of the model config without volatile keys
    lm_head_probe: list[float]  # fixed entries of the LM head weight, compared with a tolerance (any dtype)


@dataclass
class MedusaCheckpoint:
    """Everything in ``config.json``."""

    shape: HeadsShape
    target: TargetIdentity
    tree: list[list[int]] | None = None  # the default tree (rank paths) chosen at calibration
    calibration: dict[str, Any] = field(default_factory=dict)  # accuracies, cost curve, c, tau
    training: dict[str, Any] = field(default_factory=dict)  # step, data, options

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "shape": asdict(self.shape), "target": asdict(self.target),
                "tree": self.tree, "calibration": self.calibration, "training": self.training}


def config_hash(model) -> str:
    """sha256 of the model's config, volatile keys (dtype, version, attention backend) left out."""
    config = model.config.to_dict()
    kept = {k: v for k, v in config.items() if k not in _VOLATILE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def lm_head_probe(model) -> list[float]:
    """``_PROBE_SIZE`` LM head weights at fixed, evenly spread flat indices, as floats."""
    weight = model.get_output_embeddings().weight.detach().reshape(-1)
    index = torch.linspace(0, weight.numel() - 1, _PROBE_SIZE).long().to(weight.device)
    return weight.index_select(0, index).float().cpu().tolist()


def target_identity(target) -> TargetIdentity:
    model = target.model
    return TargetIdentity(model.config.model_type, config_hash(model), lm_head_probe(model))


def check_identity(saved: TargetIdentity, target, source: str) -> None:
    """Refuse heads trained for another target, saying what differs."""
    actual = target_identity(target)
    if saved.config_hash != actual.config_hash:
        raise ValueError(
            f"Medusa heads {source} were trained for another target: its config hash is "
            f"{saved.config_hash[:12]}, this target's is {actual.config_hash[:12]} "
            f"(model_type {saved.model_type!r} vs {actual.model_type!r})"
        )
    saved_probe = torch.tensor(saved.lm_head_probe, dtype=torch.float64)
    actual_probe = torch.tensor(actual.lm_head_probe, dtype=torch.float64)
    if saved_probe.shape != actual_probe.shape or not torch.allclose(
        saved_probe, actual_probe, rtol=_PROBE_RTOL, atol=_PROBE_ATOL
    ):
        raise ValueError(
            f"Medusa heads {source} were trained for another target: same architecture "
            f"(config hash {saved.config_hash[:12]}) but different LM head weights"
        )


def save_checkpoint(folder: str | Path, heads: MedusaHeads, meta: MedusaCheckpoint,
                    dtype: torch.dtype | None = None) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` (heads cast to ``dtype`` if given)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in heads.state_dict().items()}
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": FORMAT})
        (tmp / CONFIG_FILE).write_text(json.dumps(meta.to_json(), indent=1) + "\n")
        for path, mode in ((tmp / WEIGHTS_FILE, 0o644), (tmp / CONFIG_FILE, 0o644), (tmp, 0o755)):
            os.chmod(path, mode)  # mkdtemp makes a private folder; a checkpoint is meant to be shared
        _swap_in(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _swap_in(new: Path, folder: Path) -> None:
    """Replace ``folder`` by ``new`` with renames only (the old one is moved aside, then removed)."""
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
        os.replace(folder, old / folder.name)
    os.replace(new, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def resolve(weights: str | Path) -> Path:
    """A checkpoint folder from a path or a ``zoo:`` name."""
    if isinstance(weights, str) and weights.startswith("zoo:"):
        from specfamily.zoo import zoo_path

        return zoo_path(weights)
    if not isinstance(weights, (str, Path)):
        raise TypeError(f"weights must be a path, a zoo: name or 'random', got {type(weights).__name__}")
    return Path(weights)


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
    return MedusaCheckpoint(HeadsShape(**raw["shape"]), TargetIdentity(**raw["target"]), raw.get("tree"),
                            raw.get("calibration") or {}, raw.get("training") or {})


def load_checkpoint(weights: str | Path, target) -> tuple[MedusaHeads, MedusaCheckpoint]:
    """Heads for ``target`` from a checkpoint folder or zoo name; a checkpoint for another target is refused."""
    folder = resolve(weights)
    meta = read_checkpoint(folder)
    check_identity(meta.target, target, f"at {folder}")
    heads = build_heads(target, meta.shape)
    state = load_file(str(folder / WEIGHTS_FILE), device=str(target.device))
    expected = heads.state_dict()
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"{folder / WEIGHTS_FILE} does not match its config: missing {missing}, unexpected {extra}")
    heads.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})
    return heads.eval(), meta
