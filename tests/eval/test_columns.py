"""auto column keys: messages before turns before text, ids that are unique, categories, explicit keys win."""

from __future__ import annotations

import pytest

from specfamily.eval.columns import detect_prompt_key, resolve_columns

AUTO = {"field": "auto", "template": None, "ids_field": None, "turns_field": "auto", "messages_field": "auto",
        "id_field": "auto", "category_field": "auto", "select": "per_category"}


def _resolve(rows, **options):
    columns = list(rows[0])
    return resolve_columns({**AUTO, **options}, columns, rows[0], lambda c: [row[c] for row in rows])


def test_messages_column_comes_before_a_text_prompt_column():
    rows = [{"prompt": "hi", "prompt_id": "u1", "messages": [{"role": "user", "content": "hi"}]},
            {"prompt": "yo", "prompt_id": "u2", "messages": [{"role": "user", "content": "yo"}]}]
    resolved = _resolve(rows)
    assert (resolved["messages_field"], resolved["field"], resolved["turns_field"]) == ("messages", None, None)
    assert (resolved["id_field"], resolved["category_field"], resolved["select"]) == ("prompt_id", None, "spread")


def test_a_list_of_turns_then_a_text_column():
    assert detect_prompt_key(["prompt", "category"], {"prompt": ["a", "b"], "category": "x"}) == ("turns_field",
                                                                                                  "prompt")
    assert detect_prompt_key(["question", "answer"], {"question": "q", "answer": "a"}) == ("field", "question")
    assert detect_prompt_key(["body", "n"], {"body": "only text column", "n": 3}) == ("field", "body")


def test_no_prompt_column_says_what_was_looked_for():
    with pytest.raises(ValueError, match=r"no prompt column found among a, b: .* name it with dataset.field=COLUMN"):
        detect_prompt_key(["a", "b"], {"a": "x", "b": "y"})


def test_ids_must_be_unique_and_categories_keep_per_category():
    rows = [{"text": "x", "id": "same", "question_id": 1, "category": "c"},
            {"text": "y", "id": "same", "question_id": 2, "category": "d"}]
    resolved = _resolve(rows)
    assert (resolved["field"], resolved["id_field"], resolved["category_field"]) == ("text", "question_id", "category")
    assert resolved["select"] == "per_category"


def test_an_explicit_prompt_key_turns_the_auto_ones_off():
    rows = [{"question": "q", "messages": [{"role": "user", "content": "m"}]}]
    resolved = _resolve(rows, template="Q: {question}")
    assert (resolved["template"], resolved["field"], resolved["messages_field"]) == ("Q: {question}", None, None)
