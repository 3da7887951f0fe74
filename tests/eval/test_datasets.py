"""Prompt sets: local files through datasets.load_dataset, fields, templates, ids, selection, errors."""

from __future__ import annotations

import json

import pytest
from eval_helpers import TEXTS
from transformers import AutoTokenizer

from specfamily.eval.datasets import DatasetSpec, load_prompts, select_indices


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
        ({"field": None}, "set field, template or ids_field"),
    ],
)
def test_bad_values(options, message):
    with pytest.raises(ValueError, match=message):
        DatasetSpec("d", "json", **options)


def test_unknown_key_is_named():
    with pytest.raises(TypeError, match=r"unknown key\(s\) \['feild'\]"):
        DatasetSpec.from_config({"name": "d", "path": "json", "feild": "text"})


def test_duplicate_ids_are_refused(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a", "ids": [1]}\n{"id": "a", "ids": [2]}\n')
    with pytest.raises(ValueError, match="id 'a' appears twice in field 'id'"):
        load_prompts(DatasetSpec("dup", str(path), ids_field="ids", id_field="id"))
