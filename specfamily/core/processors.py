"""Logits processors a model's generation config asks for, which specfamily does not apply (so it refuses them).

transformers' ``generate()`` builds logits processors from ``model.generation_config`` (repetition penalty, n-gram
blocking, suppressed or forced tokens, minimum lengths, sequence bias, ...). The verifier decodes the model's plain
distribution, so with any of them set specfamily's text would silently differ from ``generate()``.
"""

from __future__ import annotations

from transformers import PreTrainedModel

# Logits processors transformers' generate() builds from a model's generation config, with the values at which
# each one acts (as in GenerationMixin._get_logits_processor, transformers 5.24, where every default is None).
# specfamily does not apply them, so its text would silently differ from generate(): such models are refused.
# Sampling settings (temperature, top_k, top_p, min_p, typical_p, epsilon/eta cutoffs, do_sample) are not
# refused: specfamily takes its sampling explicitly (SamplingConfig) and greedy decoding ignores them.
_PROCESSORS = {
    "repetition_penalty": lambda v: v != 1.0,
    "no_repeat_ngram_size": lambda v: v > 0,
    "bad_words_ids": lambda v: len(v) > 0,
    "suppress_tokens": lambda v: len(v) > 0,
    "begin_suppress_tokens": lambda v: len(v) > 0,
    "sequence_bias": lambda v: len(v) > 0,
    "min_length": lambda v: v > 0,
    "min_new_tokens": lambda v: v > 0,
    "forced_bos_token_id": lambda v: True,
    "forced_eos_token_id": lambda v: True,
    "exponential_decay_length_penalty": lambda v: True,
    "guidance_scale": lambda v: v != 1,
    "watermarking_config": lambda v: True,
    "force_words_ids": lambda v: len(v) > 0,
    "constraints": lambda v: len(v) > 0,
}


def active_logits_processors(generation_config) -> list[str]:
    """The logits-processor settings of a GenerationConfig that would change generate()'s scores, by name."""
    if generation_config is None:
        return []
    return [name for name, acts in _PROCESSORS.items()
            if (value := getattr(generation_config, name, None)) is not None and acts(value)]


def check_generation_config(model: PreTrainedModel) -> None:
    """Refuse a model whose generation config asks for logits processors specfamily does not apply."""
    active = active_logits_processors(getattr(model, "generation_config", None))
    if active:
        settings = ", ".join(f"{name}={getattr(model.generation_config, name)!r}" for name in active)
        raise ValueError(
            f"{type(model).__name__}'s generation_config sets logits processors that specfamily does not apply "
            f"({settings}): it decodes the model's plain distribution, so its text would differ from generate(). "
            f"Reset them on the model (model.generation_config.{active[0]} = None) and pass the model to load_target."
        )
