"""Prompt sets: local files through datasets.load_dataset, fields, templates, ids, selection, errors; Spec-Bench."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from eval_helpers import TEXTS, chat_tokenizer
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from specfamily.eval.config import configs_dir
from specfamily.eval.datasets import (
    DatasetSpec,
    load_prompts,
    load_rows,
    per_category_indices,
    select_indices,
    shipped_set_path,
    turn_prompt_ids,
)
from specfamily.io.chat import chat_prompt_ids


@pytest.fixture(scope="module")
def tokenizer(tiny_pair):
    return AutoTokenizer.from_pretrained(tiny_pair["target"])


def _spec(pair, **options) -> DatasetSpec:
    return DatasetSpec(**{"name": "local", "path": "json", "data_files": str(pair["prompts"]), **options})


def test_local_jsonl_text_field(tiny_pair, tokenizer):
    prompts = load_prompts(_spec(tiny_pair, field="text", id_field="id", num_examples=3), tokenizer)
    assert [p.id for p in prompts] == ["p0", "p1", "p2"]
    assert [p.index for p in prompts] == [0, 1, 2]
    assert prompts[1].ids == tokenizer(TEXTS[1])["input_ids"]


def test_missing_field_lists_the_fields_the_dataset_has(tiny_pair, tokenizer):
    with pytest.raises(ValueError, match=r"dataset 'local' has no field 'prompt'; its fields are: id, text, lang"):
        load_prompts(_spec(tiny_pair, field="prompt"), tokenizer)


def test_template_over_fields(tiny_pair, tokenizer):
    prompts = load_prompts(_spec(tiny_pair, template="# {lang}\n{text}", num_examples=1), tokenizer)
    assert prompts[0].ids == tokenizer("# py\n" + TEXTS[0])["input_ids"]
    with pytest.raises(ValueError, match=r"has no field 'language'; its fields are: id, text, lang"):
        load_prompts(_spec(tiny_pair, template="# {language}\n{text}"), tokenizer)


def test_ids_field_needs_no_tokenizer_and_prompts_are_cut_from_the_left(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text("".join(json.dumps({"ids": list(range(i, i + 6))}) + "\n" for i in range(4)))
    prompts = load_prompts(DatasetSpec("ids", str(path), ids_field="ids", max_prompt_tokens=4))
    assert [p.ids for p in prompts] == [list(range(i + 2, i + 6)) for i in range(4)]
    assert [p.id for p in prompts] == ["0", "1", "2", "3"]


def test_csv_file_by_path_and_text_without_tokenizer(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt\nhello\nworld\n")
    with pytest.raises(ValueError, match="has text prompts but the target has no tokenizer; set ids_field"):
        load_prompts(DatasetSpec("csv", str(path)))


def test_chat_template_wraps_the_prompt(tiny_pair, tokenizer):
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    spec = _spec(tiny_pair, field="text", chat_template=True, system_prompt="be brief", num_examples=1)
    prompt = load_prompts(spec, tokenizer)[0]
    expected = f"<system>be brief<user>{TEXTS[0]}<assistant>"
    assert prompt.ids == tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_zoo_prompt_set_with_exact_ids():
    from specfamily.zoo import prompt_set_path

    spec = DatasetSpec("continue", "zoo:continue", ids_field="prompt_ids", id_field="id", num_examples=3,
                       select="spread")
    prompts = load_prompts(spec)
    rows = [json.loads(line) for line in prompt_set_path("continue").read_text().splitlines()]
    picked = select_indices(len(rows), 3, "spread")
    assert [p.id for p in prompts] == [rows[i]["id"] for i in picked]
    assert prompts[2].ids == rows[picked[2]]["prompt_ids"]


def test_select_indices():
    assert select_indices(10, 3, "first") == [0, 1, 2]
    assert select_indices(10, 3, "spread") == [0, 3, 6]
    assert select_indices(2, 5, "spread") == [0, 1]
    assert select_indices(4, None) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"num_examples": -1}, "num_examples must be an integer >= 1, got -1"),
        ({"select": "random"}, "select must be one of"),
        ({"field": None}, "set field, template, ids_field, turns_field or messages_field"),
        ({"select": "per_category"}, "select per_category needs category_field"),
        ({"turns_field": "turns"}, "later turns are asked through the chat template; set chat_template: true, or "
                                   "max_turns: 1"),
        ({"turns_field": "turns", "chat_template": True, "ids_field": "ids"}, "unset ids_field, template and"),
        ({"messages_field": "messages", "turns_field": "turns", "chat_template": True}, "the other of turns_field"),
        ({"messages_field": "messages"}, "later turns are asked through the chat template"),
        ({"chat_template": "no-such-template.jinja"}, "chat_template 'no-such-template.jinja' is neither a file nor a "
                                                      "Jinja template"),
        ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs must be a mapping"),
        ({"turns_field": "turns", "chat_template": True, "max_turns": 0}, "max_turns must be an integer >= 1"),
    ],
)
def test_bad_values(options, message):
    with pytest.raises(ValueError, match=message):
        DatasetSpec("d", "json", data_files="p.jsonl", **options)


def test_a_builder_path_without_files_is_refused_before_loading():
    """The papercut of dataset=jsonl: data_files is null by default (a hub path needs no override), and a builder
    path left without files says what to set."""
    with pytest.raises(ValueError, match=r"dataset 'jsonl': path 'json' reads the files named by data_files; set "
                                         r"dataset.data_files=FILE"):
        DatasetSpec.from_config(OmegaConf.load(configs_dir() / "dataset" / "jsonl.yaml"))
    spec = DatasetSpec.from_config({**OmegaConf.load(configs_dir() / "dataset" / "jsonl.yaml"), "path": "openai/gsm8k"})
    assert (spec.path, spec.data_files, spec.field) == ("openai/gsm8k", None, "prompt")


def test_unknown_key_is_named():
    with pytest.raises(TypeError, match=r"unknown key\(s\) \['feild'\]"):
        DatasetSpec.from_config({"name": "d", "path": "json", "feild": "text"})


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a", "ids": [1]}\n{"id": "a", "ids": [2]}\n')
    with pytest.raises(ValueError, match="id 'a' appears twice in field 'id'"):
        load_prompts(DatasetSpec("dup", str(path), ids_field="ids", id_field="id"))


SPEC_BENCH_CATEGORIES = {
    "writing": 10, "roleplay": 10, "reasoning": 10, "math": 10, "coding": 10, "extraction": 10, "stem": 10,
    "humanities": 10, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80,
}


@pytest.fixture(scope="module")
def chat_tok():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def spec_bench_spec():
    return DatasetSpec.from_config(OmegaConf.load(configs_dir() / "dataset" / "spec_bench.yaml"))


def test_spec_bench_ships_with_its_license_and_attribution(spec_bench_spec):
    folder = shipped_set_path("spec_bench").parent
    assert spec_bench_spec.path == "specfamily:spec_bench" and shipped_set_path("spec_bench").name == "question.jsonl"
    assert (folder / "LICENSE.txt").read_text().startswith("Apache License")
    readme = (folder / "README.md").read_text()
    assert "hemingkx/Spec-Bench" in readme and "fd2c1cd7d2201ef71db4c5f4e455008f017967bf" in readme
    assert "never train" in readme
    with pytest.raises(ValueError, match="unknown shipped prompt set 'spec-bench'; shipped: spec_bench"):
        shipped_set_path("spec-bench")


def test_spec_bench_rows(spec_bench_spec):
    rows = load_rows(spec_bench_spec)
    assert len(rows) == 480 and {"question_id", "category", "turns", "reference"} <= set(rows.column_names)
    assert Counter(rows["category"]) == SPEC_BENCH_CATEGORIES
    two_turns = {row["category"] for row in rows if len(row["turns"]) == 2}
    assert two_turns == {c for c, n in SPEC_BENCH_CATEGORIES.items() if n == 10}
    assert sum(len(turns) for turns in rows["turns"]) == 560 and len(set(rows["question_id"])) == 480


def test_per_category_indices_spread_within_each_category():
    categories = ["a"] * 4 + ["b"] * 2 + ["c"] + ["a"] * 2
    assert per_category_indices(categories, 2) == [0, 3, 4, 5, 6]  # a: rows 0,1,2,3,7,8 -> 0 and 3 (of 6)
    assert per_category_indices(categories, 1) == [0, 4, 6]
    assert per_category_indices(categories, None) == list(range(9))


def test_spec_bench_default_covers_every_category_with_chat_prompts(spec_bench_spec, chat_tok):
    prompts = load_prompts(spec_bench_spec, chat_tok)
    assert [p.category for p in prompts] == list(SPEC_BENCH_CATEGORIES)  # one per category, in file order
    assert sum(p.n_turns for p in prompts) == 21  # the 8 MT-bench questions have two turns
    first = prompts[0]
    assert (first.id, first.index, first.n_turns) == ("81", 0, 2) and first.turns[1].startswith("Rewrite")
    assert first.ids == chat_prompt_ids(chat_tok, [first.turns[0]])
    assert chat_tok.decode(first.ids).endswith(f"<|user|>{first.turns[0]}<|end|>\n<|assistant|>")


def test_spec_bench_selection_and_first_turns_only(spec_bench_spec, chat_tok):
    spec = dataclasses.replace(spec_bench_spec, num_examples=2, max_turns=1)
    prompts = load_prompts(spec, chat_tok)
    assert Counter(p.category for p in prompts) == {c: 2 for c in SPEC_BENCH_CATEGORIES}
    assert [p.index for p in prompts if p.category == "translation"] == [80, 120]  # spread over rows 80..159
    assert all(p.n_turns == 1 and len(p.turns) == 1 for p in prompts)


def test_turn_two_prompt_holds_the_answer_and_is_cut_like_turn_one(spec_bench_spec, chat_tok):
    prompt = load_prompts(dataclasses.replace(spec_bench_spec, num_examples=1), chat_tok)[0]
    assert turn_prompt_ids(spec_bench_spec, prompt, [], chat_tok) == prompt.ids
    second = turn_prompt_ids(spec_bench_spec, prompt, ["Aloha."], chat_tok)
    assert second == chat_prompt_ids(chat_tok, list(prompt.turns), ["Aloha."])
    assert "<|assistant|>Aloha.<|end|>\n<|user|>Rewrite" in chat_tok.decode(second)
    cut = dataclasses.replace(spec_bench_spec, max_prompt_tokens=20)
    assert turn_prompt_ids(cut, prompt, ["Aloha."], chat_tok) == second[-20:]
    with pytest.raises(ValueError, match="prompt '81' has 2 turn"):
        turn_prompt_ids(spec_bench_spec, prompt, ["a", "b"], chat_tok)


def test_turns_without_chat_template_for_first_turns_only(tmp_path, chat_tok):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"turns": ["one", "two"]}) + "\n" + json.dumps({"turns": "not a list"}) + "\n")
    spec = DatasetSpec("q", str(path), field=None, turns_field="turns", max_turns=1, num_examples=1)
    prompt = load_prompts(spec, chat_tok)[0]
    assert prompt.ids == chat_tok("one", add_special_tokens=True)["input_ids"] and prompt.turns == ("one",)
    with pytest.raises(ValueError, match="field 'turns' must hold a non-empty list of strings"):
        load_prompts(dataclasses.replace(spec, num_examples=None), chat_tok)
