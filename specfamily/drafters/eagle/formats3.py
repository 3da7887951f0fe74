"""EAGLE-3 checkpoints on disk, read and written in the field's two layouts.

- ``eagle`` (EAGLE repository / SpecForge, what SGLang loads): config.json with architectures
  ``LlamaForCausalLMEagle3``, the draft layer's Llama dimensions, ``vocab_size`` and ``draft_vocab_size``; tensors
  ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` (optionally
  ``embed_tokens.weight``); feature layers in ``eagle_config.eagle_aux_hidden_state_layer_ids``, else the default.
- ``speculators`` (vLLM): config.json with ``speculators_model_type: eagle3``, ``transformer_layer_config``,
  ``draft_vocab_size``, top-level ``eagle_aux_hidden_state_layer_ids`` and ``speculators_config``; tensors as above
  with ``layers.0.*`` for ``midlayer.*``.

Feature-layer ids. In memory a layer is named as transformers' ``output_hidden_states`` indexes it (0 the
embeddings, i the output of decoder layer i - 1, L the state after the final norm). Each layout counts as the
engine that loads it captures (``ID_OFFSET``: hidden_states index = id + offset):

- ``eagle``: an id names the decoder layer whose *output* is taken, hidden_states[id + 1] (SGLang's
  ``set_eagle3_layers_to_capture`` adds one; SpecForge's default ids are [1, L // 2 - 1, L - 4]). Without ids,
  SGLang and the EAGLE repository take the states entering layers 2, L // 2 and L - 3: ``default_layers``.
- ``speculators``: an id names the decoder layer whose *input* is taken, hidden_states[id] (vLLM's
  ``aux_hidden_state_layers``, default (2, L // 2, L - 3)); vLLM ignores ``eagle_config`` ids in an ``eagle`` folder.

Neither engine captures the embeddings or our L; such layers are written as the arithmetic gives so that our own
folders round-trip. Our writer also records the layers in our indexing (``specfamily.hidden_state_ids``, checked on
load); a ``specfamily`` entry without it marks an older folder of ours whose ids are hidden_states indexes.

Tensors come from ``model.safetensors`` (sharded with an index too) or ``pytorch_model.bin`` loaded with
``weights_only=True`` only. We write the ``eagle`` layout unless asked otherwise, with a ``specfamily`` entry naming
the target (checked on load). A checkpoint that does not fit the target is refused in one line naming both sides'
shapes. Folders are written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig

from specfamily.core.target import Target
from specfamily.drafters.eagle.model3 import Eagle3Model, Eagle3Shape, build_model, default_layers
from specfamily.drafters.eagle.storage import check_embedding, load_checked, read_tensors, resolve_weights
from specfamily.drafters.shared.draft_vocab import d2t_of, t2d_of, vocab_from_d2t
from specfamily.io.files import write_folder_atomically
from specfamily.io.identity import check_identity, target_identity

LAYOUTS = ("eagle", "speculators")
ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
              "rms_norm_eps", "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias")
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
ID_OFFSET = {"eagle": 1, "speculators": 0}  # hidden_states index = the layout's id + this (module docstring)
CONVENTION = {"eagle": "EAGLE/SpecForge ids, each a decoder layer's output",
              "speculators": "speculators ids, each a decoder layer's input"}
MARKER = "hidden_state_ids"  # our writer's record of the layers in transformers' hidden_states indexing


def detect_layout(config: dict[str, Any], where: str) -> str:
    """``speculators`` or ``eagle`` from a checkpoint's config.json; a ValueError for anything else."""
    if config.get("speculators_model_type") is not None or "speculators_config" in config:
        if config.get("speculators_model_type") != "eagle3":
            raise ValueError(f"{where}: a speculators checkpoint of type {config.get('speculators_model_type')!r}, "
                             "not eagle3")
        return "speculators"
    if ARCHITECTURE in (config.get("architectures") or []):
        return "eagle"
    raise ValueError(f"{where}: not an EAGLE-3 checkpoint (architectures {config.get('architectures')!r}; expected "
                     f"{ARCHITECTURE!r} or a speculators config)")


def load_eagle3(source: str | Path, target: Target) -> Eagle3Model:
    """The EAGLE-3 drafter stored in folder ``source`` (either layout; a model-hub name ``owner/name`` is downloaded
    first, a ``zoo:`` name is its shipped folder) for ``target``, refused if it does not fit."""
    folder = resolve_weights(source, "eagle3")
    config = json.loads((folder / "config.json").read_text())
    layout = detect_layout(config, str(folder))
    if "specfamily" in config:
        check_identity(config["specfamily"].get("target", {}), target.model, f"eagle3 weights {str(folder)!r}")
    layer_config, layers, before = _read_config(config, layout, target, str(folder))
    tensors = {_our_name(k): v for k, v in read_tensors(folder).items() if not k.startswith("verifier")}
    return _assemble(tensors, Eagle3Shape(layer_config, layers, before), target, str(folder))


def _read_config(config: dict, layout: str, target: Target, where: str) -> tuple[LlamaConfig, tuple[int, ...], bool]:
    """(the draft layer's config, the feature layers, norm_before_residual), checked against the target."""
    if layout == "speculators":
        flags = [flag for flag in UNSUPPORTED_FLAGS if config.get(flag)]
        if flags:
            raise ValueError(f"{where}: speculators options {flags} are not supported yet")
    layer = dict(config["transformer_layer_config"]) if layout == "speculators" else config
    layers = feature_layers(config, layout, target.num_layers, where)
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{where}: {layer['num_hidden_layers']} draft layers; eagle3 here runs exactly 1")
    sizes = {"hidden size": (int(layer["hidden_size"]), target.hidden_size),
             "vocabulary": (int(layer.get("vocab_size", target.vocab_size)), target.vocab_size)}
    for what, (saved, ours) in sizes.items():
        if saved != ours:
            raise ValueError(f"{where}: checkpoint {what} {saved} does not fit the target's {ours}")
    options = {key: layer[key] for key in LAYER_KEYS if layer.get(key) is not None}
    llama = LlamaConfig(**options, vocab_size=target.vocab_size, num_hidden_layers=1, tie_word_embeddings=False,
                        rope_parameters=_rope(layer))
    return llama, layers, bool(config.get("norm_before_residual", False))


def feature_layers(config: dict[str, Any], layout: str, num_layers: int, where: str) -> tuple[int, ...]:
    """The target layers (transformers' hidden_states indexing) a checkpoint's config.json names, read in its
    layout's convention (module docstring), for a target of ``num_layers`` decoder layers; the references' default
    when it names none. A ValueError in one line naming the ids, their convention and the target's range."""
    holder = config if layout == "speculators" else config.get("eagle_config") or {}
    ids = [int(i) for i in holder.get("eagle_aux_hidden_state_layer_ids") or []]  # in the layout's convention
    if not ids:
        return default_layers(num_layers)
    if isinstance(config.get("specfamily"), dict) and MARKER not in config["specfamily"]:  # an older folder of ours
        offset = 0
        convention = "ids written here before the layouts' conventions were told apart, hidden_states indexes"
    else:
        offset, convention = ID_OFFSET[layout], CONVENTION[layout]
    layers = tuple(i + offset for i in ids)
    if any(not 0 <= h <= num_layers for h in layers):
        raise ValueError(f"{where}: checkpoint feature layers {ids} ({convention}: hidden_states {list(layers)}) do "
                         f"not fit a target of {num_layers} layers (hidden_states in [0, {num_layers}], ids in "
                         f"[{-offset}, {num_layers - offset}])")
    ours = config.get("specfamily") or {}
    if MARKER in ours and tuple(ours[MARKER]) != layers:
        raise ValueError(f"{where}: config ids {ids} ({convention}) name hidden_states {list(layers)}, but its "
                         f"specfamily entry records hidden_states {list(ours[MARKER])}")
    return layers


def _rope(layer: dict) -> dict:
    """transformers 5's rope_parameters from a v4-style config (rope_theta, rope_scaling) or a v5 one."""
    if isinstance(layer.get("rope_parameters"), dict):
        return dict(layer["rope_parameters"])
    scaling = dict(layer.get("rope_scaling") or {})
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    return {**scaling, "rope_type": kind, "rope_theta": float(layer.get("rope_theta", 10000.0))}


def _our_name(key: str) -> str:
    return "midlayer." + key[len("layers.0."):] if key.startswith("layers.0.") else key


def _assemble(tensors: dict[str, torch.Tensor], shape: Eagle3Shape, target: Target, where: str) -> Eagle3Model:
    """Build the model, check each tensor's shape against it (one line naming both), sort the head by target id."""
    d2t, t2d = tensors.pop("d2t", None), tensors.pop("t2d", None)
    vocab, order = (None, None) if d2t is None else vocab_from_d2t(d2t, target.vocab_size, t2d)
    if vocab is not None and vocab.size == target.vocab_size:
        vocab = None if bool((vocab.ids == torch.arange(target.vocab_size)).all()) else vocab
    if order is not None and "lm_head.weight" in tensors:
        tensors["lm_head.weight"] = tensors["lm_head.weight"][order]
    model = build_model(target.model, shape, vocab, seed=None)
    embed, ours = tensors.get("embed_tokens.weight"), model.target_embed[0].weight
    if embed is not None:
        check_embedding(embed, ours, where)
    if embed is not None and torch.equal(embed.to(ours.device, ours.dtype), ours):
        del tensors["embed_tokens.weight"]  # the target's own (the references' saves carry it): read, not copied
        embed = None
    if embed is not None:
        model.embed_tokens = torch.nn.Embedding(*embed.shape).to(target.device, target.dtype)
    return load_checked(model, tensors, where, "eagle3", target.device, target.dtype)


def save_eagle3(model: Eagle3Model, folder: str | Path, target: Target, layout: str = "eagle",
                dtype: torch.dtype | None = None, verifier: str | None = None, embedding: bool = True) -> Path:
    """Write ``model`` (a drafter's ``.model``) in ``layout`` (``eagle`` or ``speculators``), atomically; cast to
    ``dtype`` on save when given (e.g. torch.float16). ``verifier``: the target's name or path recorded in a
    speculators config (default: the target's own ``_name_or_path``). ``embedding=False`` leaves out a copy of
    the target's embedding (the references' loaders need it; ours reads the target's own, uncast)."""
    if layout not in LAYOUTS:
        raise ValueError(f"eagle3 layout must be one of {LAYOUTS}, got {layout!r}")
    tensors = {_their_name(k, layout): v.detach().to("cpu", dtype or v.dtype).contiguous()
               for k, v in model.state_dict().items()}
    if embedding and "embed_tokens.weight" not in tensors:  # the references' saves carry it; SpecForge needs it
        embed = model.target_embed[0].weight
        tensors["embed_tokens.weight"] = embed.detach().to("cpu", dtype or embed.dtype).contiguous()
    vocab = model.vocab
    if vocab is not None:
        tensors["d2t"], tensors["t2d"] = d2t_of(vocab).cpu().contiguous(), t2d_of(vocab).cpu().contiguous()
    config = _write_config(model, target, layout, dtype or next(model.parameters()).dtype, verifier)

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return write_folder_atomically(Path(folder), fill)


def _their_name(key: str, layout: str) -> str:
    return "layers.0." + key[len("midlayer."):] if layout == "speculators" and key.startswith("midlayer.") else key


def _write_config(model: Eagle3Model, target: Target, layout: str, dtype: torch.dtype,
                  verifier: str | None = None) -> dict[str, Any]:
    layer = model.shape.config
    dims = {key: getattr(layer, key) for key in LAYER_KEYS if getattr(layer, key, None) is not None}
    rope = dict(layer.rope_parameters or {})
    llama = {"model_type": "llama", **dims, "num_hidden_layers": 1, "vocab_size": target.vocab_size,
             "rope_theta": rope.get("rope_theta", 10000.0), "tie_word_embeddings": False,
             "torch_dtype": str(dtype).removeprefix("torch.")}
    if rope.get("rope_type", "default") != "default":
        llama["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    draft_vocab = target.vocab_size if model.vocab is None else model.vocab.size
    layers = [h - ID_OFFSET[layout] for h in model.shape.layers]  # as ``layout`` states them
    ours = {"target": target_identity(target.model), MARKER: list(model.shape.layers)}
    if layout == "eagle":
        return {"architectures": [ARCHITECTURE], **llama, "draft_vocab_size": draft_vocab,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
                "specfamily": ours}
    verifier = {"name_or_path": verifier or getattr(target.model.config, "_name_or_path", None) or None,
                "architectures": list(getattr(target.model.config, "architectures", None) or [])}
    return {"architectures": [SPECULATORS_ARCHITECTURE], "speculators_model_type": "eagle3",
            "transformer_layer_config": llama, "draft_vocab_size": draft_vocab,
            "norm_before_residual": model.shape.norm_before_residual, "target_hidden_size": target.hidden_size,
            "eagle_aux_hidden_state_layer_ids": layers, "norm_before_fc": False, "fc_norm": False,
            "norm_output": False,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                         "verifier_accept_k": 1}],
                                   "verifier": verifier},
            "specfamily": ours}
