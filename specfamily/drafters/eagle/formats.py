"""EAGLE-1/2 heads in the EAGLE repository's layout, read and written.

The layout: ``config.json`` of a one-layer Llama (``bias`` for ``fc``, default true) and tensors ``fc.weight``
(+ ``fc.bias``), ``layers.0.self_attn.*``, ``layers.0.mlp.*``, ``layers.0.post_attention_layernorm.weight`` and,
usually, ``embed_tokens.weight``, in ``pytorch_model.bin`` (``weights_only=True``) or ``model.safetensors``.

The reference computes ``fc(concat(embed(x[t + 1]), f[t]))``, then a Llama decoder layer whose input is *not*
normalised (its layer 0 has no ``input_layernorm``), then the target's LM head, no final norm. A head read from this
layout is an :class:`EagleModel` with ``input_norm=False``; only such heads can be exported
(:func:`save_eagle_repo`). Only the Llama family has this layout; a checkpoint whose sizes do not fit the target is
refused in one line naming both sides.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from specfamily.drafters.eagle.model import EagleModel, build_model, layer_config, target_family
from specfamily.drafters.eagle.storage import check_embedding, load_checked, read_tensors
from specfamily.io.files import write_folder_atomically

FAMILIES = ("llama",)  # the reference's draft layer is a Llama layer
SIZES = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")
PREFIX = "layers.0."


def is_eagle_repo(config: dict[str, Any]) -> bool:
    """True for a config.json of the EAGLE repository's layout (a plain one-layer Llama config, no format tag)."""
    return "format" not in config and config.get("model_type", "llama") == "llama" and "hidden_size" in config \
        and not any(key in config for key in ("speculators_model_type", "draft_vocab_size", "medusa_num_heads"))


def load_eagle_repo(folder: Path, target_model: PreTrainedModel) -> EagleModel:
    """The EAGLE-1/2 head at ``folder`` (EAGLE repository layout) as an :class:`EagleModel` for this target."""
    where = str(folder)
    config = json.loads((folder / "config.json").read_text())
    check_fits(config, target_model, where)
    tensors = read_tensors(folder)
    model = build_model(target_model, input_norm=False)  # the reference's layer 0 reads fc's output as is
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is not None:
        _use_embedding(model, embed, where)
    if "fc.bias" not in tensors and not config.get("bias", True):
        tensors["fc.bias"] = torch.zeros(model.hidden_size)
    state = {_our_name(key, where): value for key, value in tensors.items()}
    return load_checked(model, state, where, "EAGLE", target_model.device, target_model.dtype)


def check_fits(config: dict[str, Any], target_model: PreTrainedModel, where: str) -> None:
    """Refuse, in one line naming both sides, a checkpoint of another family, depth or size than the target."""
    family = target_family(target_model)
    if family not in FAMILIES:
        raise ValueError(f"{where}: an EAGLE-repo checkpoint holds a Llama decoder layer; the target is {family!r}")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{where}: {config['num_hidden_layers']} draft layers; eagle here runs exactly 1")
    ours = layer_config(target_model)
    for key in SIZES:
        saved, needed = config.get(key), getattr(ours, key, None)
        if saved is not None and int(saved) != int(needed):
            raise ValueError(f"{where}: checkpoint {key} {saved} does not fit the target's {needed}")
    theta = (getattr(ours, "rope_parameters", None) or {}).get("rope_theta")
    if config.get("rope_theta") is not None and theta is not None and float(config["rope_theta"]) != float(theta):
        raise ValueError(f"{where}: checkpoint rope_theta {config['rope_theta']} does not fit the target's {theta} "
                         "(the draft layer takes the target's rotary embedding)")


def _our_name(key: str, where: str) -> str:
    if key.startswith(PREFIX):
        return "layer." + key[len(PREFIX):]
    if key.startswith("layers."):
        raise ValueError(f"{where}: tensor {key!r} belongs to a second draft layer; eagle here runs exactly 1")
    return key


def _use_embedding(model: EagleModel, embed: torch.Tensor, where: str) -> None:
    """Keep the target's embedding when the checkpoint's equals it; else draft with the checkpoint's own."""
    ours = model.parts.embed.weight
    check_embedding(embed, ours, where)
    embed = embed.to(ours.device, ours.dtype)
    if not torch.equal(embed, ours):
        own = nn.Embedding.from_pretrained(embed, freeze=True)
        model.parts = dataclasses.replace(model.parts, embed=own)


def save_eagle_repo(model: EagleModel, folder: str | Path, target_model: PreTrainedModel,
                    dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` in the EAGLE repository's layout (``config.json`` and ``pytorch_model.bin``, the file
    eagle-llm's loader reads), atomically; cast to ``dtype`` when given."""
    if model.input_norm:
        raise ValueError("this eagle head normalises its layer input (input_layernorm); EAGLE's layer 0 has no input "
                         "norm, so it has no exact EAGLE-repo form (train it with --reference-form to export it)")
    if model.vocab is not None:
        raise ValueError(f"this eagle head drafts over a {model.vocab.size}-token draft vocabulary; the EAGLE-repo "
                         "layout drafts over the full vocabulary")
    target_family(target_model)
    check_fits({}, target_model, "export")
    dtype = dtype or model.fc.weight.dtype
    tensors = {_their_name(k): v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    tensors["embed_tokens.weight"] = model.parts.embed.weight.detach().to("cpu", dtype).contiguous()
    config = _repo_config(target_model, dtype)

    def fill(tmp: Path) -> None:
        torch.save(tensors, tmp / "pytorch_model.bin")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return write_folder_atomically(Path(folder), fill)


def _their_name(key: str) -> str:
    return PREFIX + key[len("layer."):] if key.startswith("layer.") else key


def _repo_config(target_model: PreTrainedModel, dtype: torch.dtype) -> dict[str, Any]:
    layer = layer_config(target_model)
    keys = (*SIZES, "rms_norm_eps", "max_position_embeddings", "hidden_act", "pad_token_id", "bos_token_id",
            "eos_token_id", "pretraining_tp")
    dims = {key: getattr(layer, key) for key in keys if getattr(layer, key, None) is not None}
    rope = dict(getattr(layer, "rope_parameters", None) or {})
    theta, kind = rope.pop("rope_theta", 10000.0), rope.pop("rope_type", "default")
    scaling = None if kind == "default" else {"type": kind, **rope}  # the v4 form EAGLE's config validates
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **dims, "num_hidden_layers": 1,
            "rope_theta": theta, "rope_scaling": scaling, "bias": True, "tie_word_embeddings": False,
            "torch_dtype": str(dtype).removeprefix("torch.")}
