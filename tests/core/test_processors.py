"""Logits processors from a model's generation config: each verified row processed with its own context, as
generate() processes its scores (greedy equality token for token, every row against transformers' own processors),
the unsupported ones refused in one line, nothing at all done when none is set."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

import specfamily as sf
from specfamily.core import acceptance, processors
from specfamily.core.acceptance import with_processors
from specfamily.core.context import DecodeContext
from specfamily.core.processors import (
    SUPPORTED,
    Processors,
    active_logits_processors,
    processors_for,
)
from specfamily.core.target import Target, load_target
from specfamily.core.types import Draft, SamplingConfig
from specfamily.testing import OracleDrafter, RandomTreeDrafter
from specfamily.testing.law import reference_process
from specfamily.testing.tiny import single_thread, tiny_model

VOCAB, NEW = 32, 24
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats, so a penalty and n-gram blocking act from the first token on


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():  # tiny models: intra-op threads only add overhead
        yield


def _generate(model, ids: list[int], n: int = NEW) -> list[int]:
    prompt = torch.tensor([ids])
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=n,
                         pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


class BranchingOracle(OracleDrafter):
    """The target's greedy continuation as a tree: at every depth a wrong sibling first, then the right token, so
    the accepted path skips nodes and every row's context is its own path (not the nodes before it)."""

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        right = self.continuation[len(ctx.tokens):len(ctx.tokens) + gamma]
        tokens, parents, node = [], [], -1
        for token in right:
            tokens += [(token + 1) % VOCAB, token]
            parents += [node, node]
            node = len(tokens) - 1
        return Draft(tokens, parents)


DRAFTERS = {
    "plain": lambda target: None,
    "prompt_lookup": lambda target: sf.create_drafter("prompt_lookup", target, gamma=3),
    "random_tree": lambda target: RandomTreeDrafter(target, nodes=6),
    "oracle_chain": lambda target: OracleDrafter(target, gamma=4, horizon=NEW),
    "oracle_tree": lambda target: BranchingOracle(target, gamma=4, horizon=NEW),
}
SETTINGS = {  # from the unprocessed greedy output, so that each setting changes it
    "repetition_penalty": lambda base: {"repetition_penalty": 1.3},
    "no_repeat_ngram_size": lambda base: {"no_repeat_ngram_size": 2},
    "suppress_tokens": lambda base: {"suppress_tokens": [base[0], base[3]]},
    "begin_suppress_tokens": lambda base: {"begin_suppress_tokens": [base[0]]},
    "min_new_tokens": lambda base: {"eos_token_id": base[2], "min_new_tokens": 6},
    "penalty_and_ngrams": lambda base: {"repetition_penalty": 0.8, "no_repeat_ngram_size": 3},
}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_equals_generate_with_the_models_processors(setting, drafter):
    model = tiny_model("llama", vocab_size=VOCAB)
    base = _generate(model, PROMPT)
    for name, value in SETTINGS[setting](base).items():
        setattr(model.generation_config, name, value)
    want = _generate(model, PROMPT)
    assert want != base  # the setting matters here, so a loop that ignored it would fail
    target = load_target(model)
    result = sf.generate(target, DRAFTERS[drafter](target), PROMPT, max_new_tokens=NEW)
    assert result.tokens == want
    if drafter.startswith("oracle"):  # the right tokens were drafted at depth, and each was accepted
        assert result.metrics.accepted_tokens >= len(want) // 2
        share = 1.0 if drafter == "oracle_chain" else 0.5
        assert result.metrics.accepted_tokens == share * result.metrics.proposed_tokens


def test_a_lossy_acceptance_reads_the_processed_logits_too():
    """Medusa's typical acceptance (the loop's other acceptance rule) is greedy matching at temperature 0."""
    model = tiny_model("llama", vocab_size=VOCAB)
    base = _generate(model, PROMPT)
    model.generation_config.repetition_penalty = 1.3
    want = _generate(model, PROMPT)
    assert want != base
    target = load_target(model)
    drafter = sf.create_drafter("medusa", target, weights="random", typical=True, gamma=2)
    result = sf.generate(target, drafter, PROMPT, max_new_tokens=NEW)
    assert result.lossy and result.metrics.proposed_tokens > 0
    assert result.tokens == want


def test_a_qwen2_instruct_style_config_loads_from_disk_and_decodes_as_generate(tmp_path):
    """Qwen2.5-Instruct's published generation config sets repetition_penalty=1.05 (configs/model/qwen2.5.yaml)."""
    model = tiny_model("qwen2", vocab_size=VOCAB, seed=2, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=0, pad_token_id=0, do_sample=True, eos_token_id=[30, 31],
                                               temperature=0.7, top_p=0.8, top_k=20)
    base = _generate(model, PROMPT)
    model.generation_config.repetition_penalty = 1.05
    model.save_pretrained(tmp_path)
    target = load_target(tmp_path)
    assert target.model.generation_config.repetition_penalty == 1.05
    want = _generate(target.model, PROMPT)
    assert want != base  # even a penalty of 1.05 changes this model's greedy text
    for drafter in (None, sf.create_drafter("prompt_lookup", target, gamma=3)):
        assert sf.generate(target, drafter, PROMPT, max_new_tokens=NEW).tokens == want


def _random_tree(n: int, generator: torch.Generator) -> list[int]:
    return [int(torch.randint(-1, i, (1,), generator=generator)) if i else -1 for i in range(n)]


@pytest.mark.parametrize("config", [
    {"repetition_penalty": 1.7, "no_repeat_ngram_size": 2, "suppress_tokens": [5], "begin_suppress_tokens": [6],
     "min_length": 14, "min_new_tokens": 4, "eos_token_id": 7},
    {"no_repeat_ngram_size": 1}, {"no_repeat_ngram_size": 3}, {"repetition_penalty": 0.6},
    {"min_new_tokens": 3, "eos_token_id": 7}, {"min_length": 11, "eos_token_id": [7, 2]},
])
def test_every_row_is_processed_as_transformers_processes_its_whole_context(config):
    """The incremental state over several passes against transformers' processors on each row's full context."""
    gen = torch.Generator().manual_seed(0)
    generation_config = GenerationConfig(**config)
    vocab = 10
    eos = generation_config.eos_token_id
    eos = (eos,) if isinstance(eos, int) else tuple(eos or (7,))
    state = processors_for(generation_config, eos, vocab).start(PROMPT, vocab, torch.device("cpu"))
    committed = list(PROMPT)
    for step in range(4):
        parents = _random_tree(9, gen)
        tokens = torch.randint(0, vocab, (9,), generator=gen)
        logits = torch.randn(10, vocab, generator=gen, dtype=torch.float64) * 3  # (n + 1, V)
        ours = state.apply(committed, tokens, torch.tensor(parents), logits)
        for row, path in enumerate(processors.draft_paths(parents)):
            context = torch.tensor([committed + tokens[path].tolist()])
            theirs = reference_process(context, logits[row:row + 1], generation_config, len(PROMPT))[0]
            assert torch.equal(ours[row], theirs), (step, row)
        committed += torch.randint(0, vocab, (step + 1,), generator=gen).tolist()  # what a pass commits


def test_a_model_with_an_unsupported_processor_is_refused_in_one_line():
    model = tiny_model("llama")
    model.generation_config.bad_words_ids = [[4]]
    message = (
        "LlamaForCausalLM's generation_config sets bad_words_ids=[[4]], a logits processor specfamily does not apply "
        "(it applies repetition_penalty, no_repeat_ngram_size, suppress_tokens, begin_suppress_tokens, min_length, "
        "min_new_tokens as generate() does): reset it on the model (model.generation_config.bad_words_ids = None) "
        "and pass the model to load_target"
    )
    with pytest.raises(ValueError) as err:
        load_target(model)
    assert str(err.value) == message


def test_an_unsupported_processor_set_after_loading_is_refused_at_the_request():
    target = load_target(tiny_model("llama"))
    target.model.generation_config.sequence_bias = {(3,): 1.0}
    with pytest.raises(ValueError, match=r"sets sequence_bias=\{\(3,\): 1\.0\}, a logits processor"):
        sf.generate(target, None, [1, 2, 3], max_new_tokens=2)


def test_a_repetition_penalty_must_be_positive():
    model = tiny_model("llama")
    model.generation_config.repetition_penalty = 0.0
    with pytest.raises(ValueError, match=r"repetition_penalty=0\.0; it must be a number > 0"):
        Target(model)


@pytest.mark.parametrize(
    "setting",
    [
        {"no_repeat_ngram_size": 3}, {"suppress_tokens": [1, 2]}, {"begin_suppress_tokens": [0]},
        {"bad_words_ids": [[4]]}, {"min_new_tokens": 5}, {"min_length": 10}, {"forced_bos_token_id": 1},
        {"forced_eos_token_id": 2}, {"sequence_bias": {(3,): 1.0}}, {"exponential_decay_length_penalty": (4, 1.5)},
        {"guidance_scale": 1.5}, {"repetition_penalty": 1.05},
    ],
)
def test_each_processor_setting_is_named(setting):
    assert active_logits_processors(GenerationConfig(**setting)) == list(setting)


def test_supported_settings_load_and_the_rest_are_refused():
    for name, value in [("repetition_penalty", 1.05), ("no_repeat_ngram_size", 3), ("suppress_tokens", [1]),
                        ("begin_suppress_tokens", [0]), ("min_length", 4), ("min_new_tokens", 2)]:
        model = tiny_model("llama")
        setattr(model.generation_config, name, value)
        Target(model)
        assert name in SUPPORTED
    for name, value in [("forced_bos_token_id", 1), ("guidance_scale", 1.5), ("sequence_bias", {(3,): 1.0})]:
        model = tiny_model("llama")
        setattr(model.generation_config, name, value)
        with pytest.raises(ValueError, match=f"sets {name}="):
            Target(model)


def test_defaults_neutral_values_and_sampling_settings_are_no_processors():
    assert active_logits_processors(GenerationConfig()) == []  # transformers 5.24: every default is None
    neutral = GenerationConfig(repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0, min_new_tokens=0,
                               suppress_tokens=[], bad_words_ids=None, guidance_scale=1.0)
    assert active_logits_processors(neutral) == []
    assert processors_for(neutral, (1,), 8) is None
    model = tiny_model("llama")
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.6, top_k=20, top_p=0.95, min_p=0.05,
                                               typical_p=0.9, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    Target(model)  # sampling defaults are settings, not processors: SamplingConfig is always explicit
    assert active_logits_processors(None) == []


def test_minimum_lengths_without_an_end_of_sequence_id_do_nothing_as_in_generate():
    assert processors_for(GenerationConfig(min_length=5, min_new_tokens=3), (), 8) is None
    assert processors_for(GenerationConfig(min_new_tokens=3), (2,), 8) == Processors(min_new_tokens=3,
                                                                                     eos_token_ids=(2,))


def test_with_no_processor_the_loop_keeps_its_acceptance_rule_itself():
    """No processor set: the rule the loop calls is verify_draft (or a lossy accept) itself, no wrapper per pass."""
    target = load_target(tiny_model("llama"))
    ctx = DecodeContext(target, torch.tensor([1, 2]), SamplingConfig(), torch.Generator(), tokens=[1, 2])
    assert with_processors(acceptance.verify_draft, ctx) is acceptance.verify_draft
    assert acceptance.acceptance(None, ctx) is acceptance.verify_draft
    target.model.generation_config.repetition_penalty = 1.2
    assert acceptance.acceptance(None, ctx) is not acceptance.verify_draft
