"""Loading the target a config names: zoo names, local folders and hub names; ``device_map`` via accelerate."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from specfamily import zoo
from specfamily.core.target import Target
from specfamily.io.sources import is_local, unreachable_model

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
    return str(zoo.resolve(name))


def _tokenizer(source: str):
    """The tokenizer saved with the model, None when it has none; a hub name the hub does not serve is an error."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except OSError as err:
        message = str(err).lower()  # a hub repository that answered but holds no tokenizer: None
        if not is_local(source) and not ("tokenizer" in message and "couldn't connect" not in message):
            raise unreachable_model(source, err) from None
        return None
    except (ValueError, KeyError):
        return None


def _target_name(node: DictConfig) -> str:
    name = node.get("target")
    if not name:
        raise ValueError("the model config has no target; set model.target=<zoo:name, folder or hub name>")
    return str(name)


def load_model_tokenizer(node: DictConfig):
    """Only the tokenizer of a ``model`` config node's target (prompts are built before the model loads)."""
    return _tokenizer(_source(_target_name(node)))


def load_model_target(node: DictConfig, device: torch.device, tokenizer=None) -> Target:
    """The target of a ``model`` config node on ``device`` (or spread by ``device_map``); ``tokenizer``: one
    already loaded (else the model's own)."""
    from specfamily.core.target import load_target

    name = _target_name(node)
    dtype = parse_dtype(node.get("dtype"))
    device_map = node.get("device_map")
    matmul = str(node.get("matmul") or "exact")
    compile = node.get("compile") or False  # false | rope | pass: Target's compile option
    if device_map is None:
        return load_target(name, tokenizer=tokenizer, device=device, dtype=dtype, matmul=matmul, compile=compile)
    from transformers import AutoModelForCausalLM

    source = _source(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype or "auto", device_map=device_map, attn_implementation="sdpa",
            use_kernels=False,  # see core/target.py: transformers >= 5.25 kernelizes by default
        )
    except OSError as err:
        if is_local(source):
            raise
        raise unreachable_model(source, err) from None
    return load_target(model, tokenizer=tokenizer if tokenizer is not None else _tokenizer(source), matmul=matmul,
                       compile=compile)
