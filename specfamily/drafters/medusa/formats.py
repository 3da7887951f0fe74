"""Medusa heads in the Medusa repository's layout, read and written.

``config.json`` with ``medusa_num_heads``, ``medusa_num_layers`` and ``base_model_name_or_path``; weights
``medusa_lm_head.pt`` (loaded with ``weights_only=True``) or ``medusa_lm_head.safetensors``, keys
``{i}.{j}.linear.weight|bias`` (head i's block j) and ``{i}.{L}.weight`` (its projection), optionally prefixed
``medusa_head.``. The reference repeats one ResBlock L times, so every block of a head shares block L - 1's weights;
we read that block into every position. ``medusa_num_layers`` 0 is an identity block.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from specfamily.drafters.medusa.heads import HeadsShape, MedusaHeads, build_heads
from specfamily.io.files import write_folder_atomically

PICKLED, SAFE = "medusa_lm_head.pt", "medusa_lm_head.safetensors"
KEY = re.compile(r"(?:medusa_head\.)?(\d+)\.(\d+)\.(?:linear\.)?(weight|bias)")


def is_medusa_repo(config: dict[str, Any]) -> bool:
    """True for a config.json of the Medusa repository's layout."""
    return "format" not in config and "medusa_num_heads" in config


def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The heads' tensors: ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` (weights only)."""
    if (folder / SAFE).is_file():
        return load_file(str(folder / SAFE))
    if (folder / PICKLED).is_file():
        return torch.load(folder / PICKLED, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no Medusa heads in {str(folder)!r} (expected {SAFE} or {PICKLED})")


def load_medusa_repo(folder: Path, target) -> MedusaHeads:
    """The Medusa heads at ``folder`` (Medusa repository layout) for ``target``, refused if they do not fit."""
    where = str(folder)
    config = json.loads((folder / "config.json").read_text())
    num_heads, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    parts = _parse(read_tensors(folder), num_heads, layers, where)
    weight = parts[(0, layers, "weight")]
    saved, needed = tuple(weight.shape), (target.vocab_size, target.hidden_size)
    if saved != needed:
        raise ValueError(f"{where}: Medusa head projection (vocabulary, hidden) {saved} does not fit the target's "
                         f"{needed}")
    heads = build_heads(target, HeadsShape(num_heads, target.hidden_size, target.vocab_size, max(layers, 1)))
    state = {}
    for i in range(num_heads):
        for j in range(max(layers, 1)):
            for kind in ("weight", "bias"):
                source = parts.get((i, layers - 1, kind)) if layers else None
                state[f"heads.{i}.blocks.{j}.linear.{kind}"] = _shaped(source, heads, f"{i}.{j}.linear.{kind}", where)
        state[f"heads.{i}.proj.weight"] = _shaped(parts[(i, layers, "weight")], heads, f"{i}.{layers}.weight", where)
    heads.load_state_dict(state, strict=True)
    return heads.eval()


def _parse(tensors: dict[str, torch.Tensor], num_heads: int, layers: int, where: str) -> dict[tuple, torch.Tensor]:
    """{(head, position, weight|bias): tensor}, every name checked against the config's heads and layers."""
    parts = {}
    for key, value in tensors.items():
        match = KEY.fullmatch(key)
        if match is None:
            raise ValueError(f"{where}: unexpected tensor {key!r} in Medusa heads")
        head, position, kind = int(match[1]), int(match[2]), match[3]
        if position == layers and (kind == "bias" or "linear" in key):
            raise ValueError(f"{where}: unexpected tensor {key!r}: position {layers} is the projection (a weight "
                             f"only) for medusa_num_layers {layers}")
        if head >= num_heads or position > layers:
            raise ValueError(f"{where}: tensor {key!r} does not fit the config's medusa_num_heads {num_heads}, "
                             f"medusa_num_layers {layers}")
        parts[(head, position, kind)] = value
    missing = [f"{i}.{layers}.weight" for i in range(num_heads) if (i, layers, "weight") not in parts]
    missing += [f"{i}.{j}.linear.{k}" for i in range(num_heads) for j in range(layers) for k in ("weight", "bias")
                if (i, j, k) not in parts]
    if missing:
        raise ValueError(f"{where}: Medusa heads lack {missing[:4]}{' ...' if len(missing) > 4 else ''} for "
                         f"medusa_num_heads {num_heads}, medusa_num_layers {layers}")
    return parts


def _shaped(tensor: torch.Tensor | None, heads: MedusaHeads, name: str, where: str) -> torch.Tensor:
    """``tensor`` checked against our module's (a zero block when None), on its device and dtype."""
    head, position, rest = name.split(".", 2)
    ours = heads.state_dict()[f"heads.{head}." + ("proj.weight" if rest == "weight" else f"blocks.{position}.{rest}")]
    if tensor is None:
        return torch.zeros_like(ours)
    if tuple(tensor.shape) != tuple(ours.shape):
        raise ValueError(f"{where}: Medusa tensor {name} has shape {tuple(tensor.shape)}; this target needs "
                         f"{tuple(ours.shape)}")
    return tensor.to(ours.device, ours.dtype)


def save_medusa_repo(heads: MedusaHeads, folder: str | Path, target, dtype: torch.dtype | None = None,
                     base_model: str | None = None) -> Path:
    """Write ``heads`` in the Medusa repository's layout (``config.json`` + ``medusa_lm_head.pt``), atomically.
    ``base_model``: the config's ``base_model_name_or_path`` (default: the target's own name or path).

    Shared-LM-head heads are written with the target's head as each projection (what they compute); heads over a
    draft vocabulary, or with different blocks within a head (the reference shares one block per head), are
    refused."""
    shape = heads.shape
    if shape.draft_vocab:
        raise ValueError(f"these Medusa heads score a {shape.draft_vocab}-token draft vocabulary; the Medusa layout "
                         "scores the full vocabulary")
    lm_head = target.model.get_output_embeddings()
    if shape.share_lm_head and getattr(lm_head, "bias", None) is not None:
        raise ValueError("the target's LM head has a bias; the Medusa layout's projections have none")
    tensors = {}
    for i, head in enumerate(heads.heads):
        blocks = list(head.blocks)
        if any(not torch.equal(b.linear.weight, blocks[-1].linear.weight) or
               not torch.equal(b.linear.bias, blocks[-1].linear.bias) for b in blocks):
            raise ValueError(f"Medusa head {i} has {len(blocks)} different residual blocks; the Medusa reference "
                             "repeats one block per head, so these heads have no exact Medusa-layout form")
        for j, block in enumerate(blocks):
            tensors[f"{i}.{j}.linear.weight"], tensors[f"{i}.{j}.linear.bias"] = block.linear.weight, block.linear.bias
        tensors[f"{i}.{len(blocks)}.weight"] = head.proj.weight if head.proj is not None else lm_head.weight
    dtype = dtype or next(iter(tensors.values())).dtype
    tensors = {k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in tensors.items()}
    config = {"medusa_num_heads": shape.num_heads, "medusa_num_layers": shape.layers,
              "base_model_name_or_path": base_model or getattr(target.model.config, "_name_or_path", "") or "",
              "hidden_size": shape.hidden_size, "vocab_size": shape.vocab_size}

    def fill(tmp: Path) -> None:
        torch.save(tensors, tmp / PICKLED)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return write_folder_atomically(Path(folder), fill)
