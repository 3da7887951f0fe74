"""Which transformers models the target wrapper can drive exactly, and what ends their text: checks made once,
when a Target is built, each refusal naming its reason."""

from __future__ import annotations

import inspect

from transformers import DynamicCache, PreTrainedModel

from specfamily.core.processors import check_generation_config

SUPPORTED_ATTENTION = ("sdpa", "eager")


def eos_ids(model: PreTrainedModel, tokenizer, vocab_size: int) -> tuple[int, ...]:
    """End-of-sequence ids inside the vocabulary: generation config, then model config, then tokenizer."""
    generation_config = getattr(model, "generation_config", None)
    for source in (generation_config, model.config.get_text_config(decoder=True), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is None:
            continue
        ids = [eos] if isinstance(eos, int) else list(eos)
        ids = [i for i in ids if isinstance(i, int) and 0 <= i < vocab_size]
        if ids:
            return tuple(dict.fromkeys(ids))
    return ()


def check_supported(model: object) -> None:
    """Refuse models this wrapper cannot drive exactly, with the reason."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"the target must be a transformers PreTrainedModel, got {type(model).__name__}")
    name = type(model).__name__
    config = model.config
    text_config = config.get_text_config(decoder=True)
    if (
        config.is_encoder_decoder
        or not getattr(text_config, "is_causal", True)
        or model.get_output_embeddings() is None
    ):
        raise ValueError(f"{name} is not a causal language model (load it with AutoModelForCausalLM)")
    params = inspect.signature(model.forward).parameters
    if "position_ids" not in params or not ({"cache", "past_key_values"} & params.keys()):
        raise ValueError(f"{name}.forward takes no position_ids or cache, which tree verification needs")
    attn = config._attn_implementation
    if attn not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"attention implementation {attn!r} is not supported (use one of {SUPPORTED_ATTENTION}); "
            'load the model with attn_implementation="sdpa"'
        )
    for key in ("sliding_window", "attention_chunk_size"):
        if getattr(text_config, key, None) is not None:
            raise ValueError(
                f"{name} uses {key}={getattr(text_config, key)}; sliding-window and chunked attention are not supported"
            )
    _check_cache_layers(model)
    check_generation_config(model)


def _check_cache_layers(model: PreTrainedModel) -> None:
    """Only a DynamicCache of plain full-attention layers can be cropped and rewritten exactly."""
    name = type(model).__name__
    if getattr(model, "_is_stateful", False):
        raise ValueError(f"{name} keeps recurrent state; only full-attention KV caches are supported")
    layer_types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        kinds = sorted(set(layer_types) - {"full_attention"})
        raise ValueError(f"{name} has {kinds} layers (hybrid, sliding or linear); only full attention is supported")
    layers = DynamicCache(config=model.config).layers
    odd = sorted({type(layer).__name__ for layer in layers if type(layer).__name__ != "DynamicLayer"})
    if odd:
        raise ValueError(f"{name} needs cache layers {odd}; only a DynamicCache of full-attention layers is supported")
