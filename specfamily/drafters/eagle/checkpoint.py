"""EAGLE drafter weights on disk: ``model.safetensors`` (fc + decoder layer) and ``config.json``.

``config.json`` records the format, the fingerprint of the target the drafter was trained for (architecture
numbers and a digest of the LM head, the final norm and the embedding) and free-form training information.
Loading for a different target is refused. Files are written to temporary names and renamed, config last.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specfamily.drafters.eagle.model import EagleModel, build_model

FORMAT = "specfamily-eagle"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_DIGEST_ROWS = 1024  # rows of each matrix hashed (evenly strided), so fingerprints stay cheap for big vocabularies


def _digest(tensors: list[torch.Tensor]) -> str:
    """sha256 (first 16 hex digits) of tensors rounded to float16, matrices sampled by rows."""
    sha = hashlib.sha256()
    for tensor in tensors:
        t = tensor.detach()
        if t.dim() == 2 and t.shape[0] > _DIGEST_ROWS:
            t = t[:: t.shape[0] // _DIGEST_ROWS]
        sha.update(str(tuple(t.shape)).encode())
        sha.update(t.to("cpu", torch.float16).contiguous().view(torch.int16).numpy().tobytes())
    return sha.hexdigest()[:16]


def _final_norm_weights(model: PreTrainedModel) -> list[torch.Tensor]:
    decoder = model.get_decoder()
    norm = getattr(decoder, "norm", None) or getattr(decoder, "ln_f", None)
    return [p for p in norm.parameters()] if norm is not None else []


def target_fingerprint(model: PreTrainedModel) -> dict[str, Any]:
    """What identifies the target a drafter was trained for."""
    config = model.config.get_text_config(decoder=True)
    head = model.get_output_embeddings().weight
    embed = model.get_input_embeddings().weight
    weights = [head, *_final_norm_weights(model)] + ([] if embed is head else [embed])
    return {
        "model_type": config.model_type,
        "hidden_size": int(config.hidden_size),
        "num_hidden_layers": int(config.num_hidden_layers),
        "vocab_size": int(head.shape[0]),
        "weights_digest": _digest(weights),
    }


def _replace_atomically(path: Path, write) -> None:
    """``write(tmp)`` then rename over ``path``, readable as a regular file (0o666 less the umask)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_eagle(
    folder: str | Path,
    model: EagleModel,
    target_model: PreTrainedModel,
    info: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the drafter's own weights (``dtype``: cast on save, e.g. float16) and its config; return the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "target": target_fingerprint(target_model),
        "family": model.family,
        "hidden_size": model.hidden_size,
        "info": info or {},
    }
    _replace_atomically(folder / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": FORMAT}))
    _replace_atomically(folder / CONFIG_FILE, lambda p: p.write_text(json.dumps(config, indent=2) + "\n"))
    return folder


def resolve_weights(source: str | Path) -> Path:
    """A ``zoo:`` name becomes its shipped folder; a path must be a folder holding an EAGLE checkpoint."""
    if isinstance(source, str) and source.startswith("zoo:"):
        from specfamily.zoo import zoo_path

        return zoo_path(source)
    folder = Path(source)
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"no eagle checkpoint at {str(folder)!r} (expected {CONFIG_FILE} and {WEIGHTS_FILE})")
    return folder


def read_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's config.json, checked to be an EAGLE checkpoint of a known format version."""
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("format") != FORMAT:
        found = config.get("format")
        raise ValueError(f"{str(folder)!r} is not an eagle checkpoint (format {found!r}, not {FORMAT!r})")
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"eagle checkpoint {str(folder)!r} has format version {config.get('format_version')!r}; "
                         f"this version of specfamily reads {FORMAT_VERSION}")
    return config


def check_target(config: dict[str, Any], target_model: PreTrainedModel, where: str) -> None:
    """Refuse weights trained for another target, naming what differs."""
    saved, current = config.get("target", {}), target_fingerprint(target_model)
    differences = [f"{key} {saved.get(key)!r} != {value!r}" for key, value in current.items()
                   if saved.get(key) != value]
    if differences:
        raise ValueError(
            f"eagle weights {where!r} were trained for another target (saved vs this target: "
            f"{'; '.join(differences)}); train a drafter for this target with "
            "`python -m specfamily.drafters.eagle.train`"
        )


def load_eagle(source: str | Path, target_model: PreTrainedModel) -> tuple[EagleModel, dict[str, Any]]:
    """The drafter stored at ``source`` (a folder or a zoo: name) for this target, and its config."""
    folder = resolve_weights(source)
    config = read_config(folder)
    check_target(config, target_model, str(source))
    model = build_model(target_model)
    state = load_file(str(folder / WEIGHTS_FILE), device=str(target_model.device))
    state = {k: v.to(target_model.dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True)
    return model.eval(), config
