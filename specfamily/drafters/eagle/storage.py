"""What every EAGLE checkpoint reader shares, whatever the layout: the folder a source names, its tensors, and a
strict load that names both sides of any mismatch. The layouts themselves are :mod:`.checkpoint` (ours),
:mod:`.formats` (the EAGLE repository's EAGLE-1/2 heads) and :mod:`.formats3` (EAGLE-3's two layouts).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from specfamily import zoo
from specfamily.io.hub import resolve_source

CONFIG_FILE = "config.json"


def resolve_weights(source: str | Path, what: str = "eagle") -> Path:
    """A ``zoo:`` name becomes its shipped folder, a hub name (``owner/name``) its downloaded one; a path must be a
    folder holding a config.json (any of the layouts); ``what`` (eagle, eagle3) names the drafter in the error."""
    if zoo.is_zoo_name(source):
        return zoo.resolve(source)
    folder = resolve_source(source)
    if not (folder / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"no {what} checkpoint at {str(folder)!r} (expected {CONFIG_FILE} and weights)")
    return folder


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint folder: safetensors (single or sharded), else pytorch_model.bin (weights only)."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return {k: v for shard in shards for k, v in load_file(str(folder / shard)).items()}
    pickled = folder / "pytorch_model.bin"
    if pickled.is_file():
        return torch.load(pickled, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no weights in {str(folder)!r} (model.safetensors, its index, or pytorch_model.bin)")


def check_embedding(embed: torch.Tensor, ours: torch.Tensor, where: str) -> None:
    """A checkpoint's ``embed_tokens.weight`` must have the target embedding's shape (one line naming both)."""
    if tuple(embed.shape) != tuple(ours.shape):
        raise ValueError(f"{where}: embed_tokens.weight has shape {tuple(embed.shape)}; the target's embedding is "
                         f"{tuple(ours.shape)}")


def load_checked(model: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str, what: str,
                 device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Load ``tensors`` (our names) into ``model`` strictly, in eval mode: an unknown name, a shape this target
    does not take or a missing tensor is refused in one line naming both sides (``what``: EAGLE or eagle3)."""
    expected = model.state_dict()
    for name, tensor in tensors.items():
        if name not in expected:
            raise ValueError(f"{where}: unexpected tensor {name!r} {tuple(tensor.shape)} in an {what} checkpoint")
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{where}: {name} has shape {tuple(tensor.shape)}; this target needs "
                             f"{tuple(expected[name].shape)}")
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"{where}: {what} checkpoint lacks {missing}")
    model.load_state_dict({k: v.to(device, dtype) for k, v in tensors.items()}, strict=True)
    return model.eval()
