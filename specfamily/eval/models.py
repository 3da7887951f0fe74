"""Loading the target a config names: zoo names, local folders and hub names; ``device_map`` via accelerate."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from specfamily.core.target import Target

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def parse_dtype(name: str | None) -> torch.dtype | str | None:
    """A torch dtype from its name; None and "auto" pass through."""
    if name is None or name == "auto":
        return name
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)} or auto")
    return DTYPES[name]


def pick_device(name: str | None, local_rank: int = 0) -> torch.device:
    """The configured device, else cuda:<local rank> when CUDA is there, else cpu."""
    if name is not None:
        return torch.device(name)
    return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")


def _source(name: str) -> str:
    """A ``zoo:`` name becomes its folder (shipped, or fetched into the user's cache on first use)."""
    if name.startswith("zoo:"):
        from specfamily.zoo import zoo_path

        return str(zoo_path(name))
    return name


def _tokenizer(source: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, KeyError):
        return None


def load_model_target(node: DictConfig, device: torch.device) -> Target:
    """The target of a ``model`` config node on ``device`` (or spread by ``device_map``)."""
    from specfamily.core.target import load_target

    name = node.get("target")
    if not name:
        raise ValueError("the model config has no target; set model.target=<zoo:name, folder or hub name>")
    dtype = parse_dtype(node.get("dtype"))
    device_map = node.get("device_map")
    if device_map is None:
        return load_target(str(name), device=device, dtype=dtype)
    from transformers import AutoModelForCausalLM

    source = _source(str(name))
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype or "auto", device_map=device_map, attn_implementation="sdpa"
    )
    return load_target(model, tokenizer=_tokenizer(source))
