"""Which target a trained drafter belongs to: a small JSON-able identity saved with the drafter's weights and checked
on load, so a drafter trained for one target is refused for another.

It holds the architecture numbers, a hash of the model config (dtype, version and attention backend left out) and a
probe of the weights compared with a tolerance: another dtype or backend still matches, a fine-tuned copy does not.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

_VOLATILE_KEYS = {
    "_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version", "_attn_implementation",
    "_attn_implementation_autoset", "use_cache", "output_hidden_states", "output_attentions", "return_dict",
}
_PROBE_PER_TENSOR = 8
_PROBE_RTOL = 1e-2
_PROBE_ATOL = 1e-3


def config_sha256(model) -> str:
    """sha256 of the model's config without its volatile keys."""
    kept = {k: v for k, v in model.config.to_dict().items() if k not in _VOLATILE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def weights_probe(model) -> list[float]:
    """``_PROBE_PER_TENSOR`` entries at fixed, evenly spread flat indices of every parameter (sorted by name)."""
    values = []
    for _, param in sorted(model.named_parameters()):
        flat = param.detach().reshape(-1)
        # float32 linspace rounds past the end of tensors over 2**24 entries; clamping keeps every other index
        index = torch.linspace(0, flat.numel() - 1, _PROBE_PER_TENSOR).long().clamp_(max=flat.numel() - 1)
        index = index.to(flat.device)
        values += flat.index_select(0, index).float().cpu().tolist()
    return values


def target_identity(model) -> dict[str, Any]:
    """The identity of a transformers causal LM (the target's ``model``)."""
    config = model.config.get_text_config(decoder=True)
    return {
        "model_type": str(config.model_type),
        "hidden_size": int(config.hidden_size),
        "num_hidden_layers": int(config.num_hidden_layers),
        "vocab_size": int(model.get_output_embeddings().weight.shape[0]),
        "config_sha256": config_sha256(model),
        "weights_probe": weights_probe(model),
    }


def identity_differences(saved: dict[str, Any], model) -> list[str]:
    """What differs between a saved identity and ``model``'s, in words; [] when they match."""
    actual = target_identity(model)
    differences = [f"{key} {saved.get(key)!r} != {actual[key]!r}" for key in
                   ("model_type", "hidden_size", "num_hidden_layers", "vocab_size") if saved.get(key) != actual[key]]
    if saved.get("config_sha256") != actual["config_sha256"]:
        differences.append(f"config sha256 {str(saved.get('config_sha256'))[:12]} != {actual['config_sha256'][:12]}")
    probe = torch.tensor(saved.get("weights_probe") or [], dtype=torch.float64)
    current = torch.tensor(actual["weights_probe"], dtype=torch.float64)
    if probe.shape != current.shape or not torch.allclose(probe, current, rtol=_PROBE_RTOL, atol=_PROBE_ATOL):
        differences.append("weights differ")
    return differences


def check_identity(saved: dict[str, Any], model, what: str, hint: str = "") -> None:
    """Raise a ValueError naming ``what`` and every difference when ``saved`` is not ``model``'s identity."""
    differences = identity_differences(saved, model)
    if differences:
        raise ValueError(f"{what} were trained for another target (saved vs this target: {'; '.join(differences)})"
                         + (f"; {hint}" if hint else ""))
