"""The shipped zoo: weights under specfamily/zoo/weights/ and prompt sets under specfamily/zoo/data/prompts/.

These fail until the trained models are exported into the package (see ZOO.md).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from specfamily.recipes.models import llama_config
from specfamily.zoo import PROMPT_SETS, zoo_path
from specfamily.zoo.prompts import load_prompt_set

SHIPPED = ("zoo:code-target", "zoo:code-draft")  # HF model folders; the Medusa heads and EAGLE layer below
CODE = 'def add(a, b):\n    """Return a + b."""\n    return a + b\n'


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_loads_in_fp32_with_finite_logits(name):
    folder = zoo_path(name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) == 4096
    assert model.config.tie_word_embeddings and model.config.max_position_embeddings == 1024
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == model.config.eos_token_id == 0
    ids = tokenizer(CODE, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == CODE
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 4096) and torch.isfinite(logits).all()


@pytest.mark.parametrize("kind", ["target", "draft"])
def test_the_recipe_builds_the_shapes_that_ship(kind):
    """`specfamily-zoo train --kind K` from scratch builds the architecture of the shipped zoo:code-K."""
    shipped = AutoConfig.from_pretrained(str(zoo_path(f"zoo:code-{kind}")))
    built = llama_config(kind, shipped.vocab_size)
    names = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "tie_word_embeddings")
    assert {n: getattr(built, n) for n in names} == {n: getattr(shipped, n) for n in names}


def test_shipped_models_share_one_tokenizer():
    files = [(zoo_path(name) / "tokenizer.json").read_bytes() for name in SHIPPED]
    assert all(f == files[0] for f in files)


@pytest.mark.parametrize("name", [name for name in PROMPT_SETS if name != "instruct"])
def test_shipped_prompt_sets_load_with_datasets(name):
    data = load_prompt_set(name)
    assert len(data) >= 200
    assert {"id", "prompt", "reference", "source", "n_prompt_tokens"} <= set(data.column_names)
    assert len(set(data["id"])) == len(data)


def _ngrams(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_instruct_prompts_are_chat_prompts_that_share_nothing_with_spec_bench():
    """The calibration prompts for chat targets: none is a Spec-Bench question, none shares 8 words in a row."""
    from specfamily.eval.datasets import shipped_set_path

    data = load_prompt_set("instruct")
    assert len(data) == 32 and all(data["chat"]) and len(set(data["id"])) == 32
    spec_bench = load_prompt_set("", shipped_set_path("spec_bench"))
    turns = [turn for row in spec_bench["turns"] for turn in row]
    evaluation = set().union(*(_ngrams(turn) for turn in turns))
    for prompt in data["prompt"]:
        assert not _ngrams(prompt) & evaluation, prompt
        assert all(prompt.lower() not in turn.lower() for turn in turns), prompt


def test_shipped_drafters_load_for_the_shipped_target():
    import specfamily as sf

    target = sf.load_target("zoo:code-target", device="cpu")
    medusa = sf.create_drafter("medusa", target)  # refuses heads trained for another target
    eagle = sf.create_drafter("eagle", target)
    assert medusa.heads.shape.num_heads == 4 and medusa.checkpoint.tree  # a calibrated default tree
    assert eagle.model.hidden_size == target.hidden_size


def test_the_whole_zoo_fits_its_size_budget():
    def size(name: str) -> int:
        return sum(f.stat().st_size for f in zoo_path(name).rglob("*") if f.is_file())

    pair = size("zoo:code-target") + size("zoo:code-draft")
    assert pair <= 30e6, f"target + draft take {pair / 1e6:.1f} MB (budget 30 MB)"
    total = pair + size("zoo:code-medusa") + size("zoo:code-eagle")
    assert total <= 50e6, f"the zoo takes {total / 1e6:.1f} MB (budget 50 MB)"
