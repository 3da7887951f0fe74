"""EAGLE drafter weights: where a drafter's model comes from (``load_eagle_weights``, ``load_eagle3_weights``: a built
model, fresh modules, the zoo's or a checkpoint) and our EAGLE-1/2 format: ``model.safetensors`` (fc + decoder
layer) and ``config.json`` (format, ``input_norm``, the target's identity, training information). Loading for a
different target is refused; folders are written atomically. ``load_eagle`` also reads the EAGLE repository's
layout (``formats``); EAGLE-3 layouts are ``formats3``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specfamily import zoo
from specfamily.core.target import Target
from specfamily.drafters.eagle.config import Eagle3Config, EagleConfig
from specfamily.drafters.eagle.formats import is_eagle_repo, load_eagle_repo
from specfamily.drafters.eagle.formats3 import load_eagle3
from specfamily.drafters.eagle.model import EagleModel, build_model
from specfamily.drafters.eagle.model3 import Eagle3Model, Eagle3Shape, default_layers, draft_layer_config
from specfamily.drafters.eagle.model3 import build_model as build_eagle3_model
from specfamily.drafters.eagle.storage import CONFIG_FILE, resolve_weights
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.io.files import write_folder_atomically
from specfamily.io.identity import check_identity, target_identity

FORMAT = "specfamily-eagle"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
DRAFT_IDS = "draft_ids"  # the reduced draft vocabulary's target ids (int64), when the drafter has one
DRAFT_COUNTS = "draft_counts"  # how often each occurred in the training data (int64), to restrict it later


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
    if model.vocab is not None:
        tensors[DRAFT_IDS] = model.vocab.ids.cpu().contiguous()
        if model.vocab.counts is not None:
            tensors[DRAFT_COUNTS] = model.vocab.counts.cpu().contiguous()
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "target": target_identity(target_model),
        "family": model.family,
        "hidden_size": model.hidden_size,
        "draft_vocab": None if model.vocab is None else model.vocab.size,
        "input_norm": model.input_norm,
        "info": info or {},
    }

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": FORMAT})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")

    return write_folder_atomically(folder, fill)


def load_eagle(source: str | Path, target_model: PreTrainedModel) -> tuple[EagleModel, dict[str, Any]]:
    """The drafter stored at ``source`` (a folder or a zoo: name) for this target, and its config."""
    folder = resolve_weights(source)
    raw = json.loads((folder / CONFIG_FILE).read_text())
    if "draft_vocab_size" in raw or "speculators_model_type" in raw:
        raise ValueError(f"{str(source)!r} holds an EAGLE-3 drafter; load it with create_drafter('eagle3', ...)")
    if is_eagle_repo(raw):
        return load_eagle_repo(folder, target_model), {}
    config = raw
    if config.get("format") != FORMAT:
        found = config.get("format")
        raise ValueError(f"{str(folder)!r} is not an eagle checkpoint (format {found!r}, not {FORMAT!r})")
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"eagle checkpoint {str(folder)!r} has format version {config.get('format_version')!r}; "
                         f"this version of specfamily reads {FORMAT_VERSION}")
    check_identity(config.get("target", {}), target_model, f"eagle weights {str(source)!r}",
                   "train a drafter for this target with `python -m specfamily.drafters.eagle.train`")
    if not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in eagle checkpoint {str(folder)!r}")
    state = load_file(str(folder / WEIGHTS_FILE), device=str(target_model.device))
    ids, counts = state.pop(DRAFT_IDS, None), state.pop(DRAFT_COUNTS, None)
    vocab = None if ids is None else DraftVocab(ids.long().cpu(), target_model.get_output_embeddings().weight.shape[0],
                                                None if counts is None else counts.long().cpu())
    input_norm = config.get("input_norm", True)  # absent: True, the form every head had before the flag existed
    if not isinstance(input_norm, bool):
        raise ValueError(f"eagle checkpoint {str(source)!r}: input_norm must be true or false, got {input_norm!r}")
    model = build_model(target_model, vocab=vocab, input_norm=input_norm)
    state = {k: v.to(target_model.dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True)
    return model.eval(), config


def load_eagle_weights(target: Target, config: EagleConfig) -> tuple[EagleModel, dict]:
    """The EAGLE-1/2 model and its calibration: fresh modules for weights="random", a built model as is, else the
    checkpoint (default: the zoo's eagle weights for this target) with the tree shape calibrated for it, if any."""
    if isinstance(config.weights, EagleModel):
        if config.weights.parts.lm_head is not target.model.get_output_embeddings():
            raise ValueError("this EagleModel was built for another target (it reads another model's LM head)")
        return config.weights, {}
    if config.weights == "random":
        ids = config.draft_vocab if isinstance(config.draft_vocab, list) else None
        return build_model(target.model, seed=config.seed, vocab=_random_vocab(ids, target.vocab_size)), {}
    weights = zoo.default_weights("eagle", target) if config.weights is None else config.weights
    model, saved = load_eagle(weights, target.model)
    if config.draft_vocab == "full":
        model.use_vocab(None)
    elif isinstance(config.draft_vocab, int):
        if model.vocab is None:
            raise ValueError("these eagle weights draft over the full vocabulary; draft_vocab=<size> restricts a "
                             "reduced one (train with --draft-vocab N)")
        model.use_vocab(model.vocab.restrict(config.draft_vocab))
    return model, saved.get("calibration") or {}


def load_eagle3_weights(target: Target, config: Eagle3Config) -> Eagle3Model:
    """The EAGLE-3 model: a built one as is, fresh modules for weights="random", else the checkpoint folder in any
    layout (default: the zoo's eagle3 weights for this target; a ``zoo:`` name is its shipped folder)."""
    weights = config.weights
    if isinstance(weights, Eagle3Model):
        if weights.target_embed[0] is not target.model.get_input_embeddings():
            raise ValueError("this Eagle3Model was built for another target (it reads another model's embedding)")
        return _checked_layers(weights, config.layers)
    if weights == "random":
        layers = config.layers or default_layers(target.num_layers)
        target.check_feature_layers(layers)
        shape = Eagle3Shape(draft_layer_config(target.model), layers)
        ids = None if config.draft_vocab is None else list(set(config.draft_vocab))  # repeats allowed here
        return build_eagle3_model(target.model, shape, _random_vocab(ids, target.vocab_size), seed=config.seed)
    if weights is None:
        weights = zoo.default_weights("eagle3", target)  # the zoo's for this target, else says how to train them
    return _checked_layers(load_eagle3(weights, target), config.layers)


def _checked_layers(model: Eagle3Model, layers: tuple[int, ...] | None) -> Eagle3Model:
    if layers is not None and tuple(layers) != model.shape.layers:
        raise ValueError(f"eagle3 layers {list(layers)} differ from the {list(model.shape.layers)} these weights "
                         "were trained on")
    return model


def _random_vocab(ids: list[int] | None, vocab_size: int) -> DraftVocab | None:
    return None if ids is None else DraftVocab(torch.tensor(sorted(ids), dtype=torch.long), vocab_size)
