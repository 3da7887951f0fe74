"""The held-out prompt sets: deterministic, drawn from held-out files only, loadable with `datasets`."""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset
from transformers import PreTrainedTokenizerFast

from specfamily.recipes.corpus import Document
from specfamily.recipes.prompt_sets import PromptSetConfig, build_prompt_sets, function_sites
from specfamily.zoo.prompts import evenly, load_prompt_set

SMALL = PromptSetConfig(complete_count=24, complete_context=96, complete_reference=24, continue_count=6,
                        continue_context=48, continue_reference=16, continue_per_file=4)

SOURCE = '''def one(x):
    """Doc."""
    return x


def only_doc():
    """Nothing else."""


def two(a,
        b):
    c = a + b
    return c


def inline(x): return x
'''


@pytest.fixture(scope="module")
def built(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("prompts")
    return out, build_prompt_sets(prepared, out, SMALL)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_function_sites():
    sites = function_sites(Document("m.py", SOURCE))
    assert [(s.name, s.prompt_end, s.body_end, s.has_docstring) for s in sites] == [
        ("one", 2, 3, True), ("two", 11, 13, False)]
    assert function_sites(Document("bad.py", "def (:\n")) == []


def test_evenly():
    assert evenly(list(range(10)), 3) == [0, 4, 9]
    assert evenly([1, 2], 5) == [1, 2] and evenly([1, 2], 0) == []


def test_complete_rows_come_from_heldout_functions(built, prepared, tiny_corpus):
    out, manifest = built
    heldout = set(json.loads((prepared / "corpus.json").read_text())["heldout_files"])
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(prepared / "tokenizer"))
    rows = _rows(out / "complete.jsonl")
    assert len(rows) == manifest["counts"]["complete"] == SMALL.complete_count
    assert [r["id"] for r in rows] == [f"complete-{i:04d}" for i in range(len(rows))]
    assert any(r["has_docstring"] for r in rows) and any(not r["has_docstring"] for r in rows)
    for row in rows:
        assert row["source"] in heldout
        text = (tiny_corpus / row["source"]).read_text()
        assert row["prompt"] + row["reference"] in text  # contiguous: prompt, then the body
        assert row["reference"].startswith("\n") and row["reference"].strip()
        assert row["prompt"].splitlines()[-1].strip().endswith(('"""', ":"))
        assert len(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]) <= SMALL.complete_context
        assert row["n_reference_tokens"] <= SMALL.complete_reference


def test_continue_rows_are_exact_token_windows(built, prepared):
    out, manifest = built
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(prepared / "tokenizer"))
    rows = _rows(out / "continue.jsonl")
    assert 0 < len(rows) == manifest["counts"]["continue"] <= SMALL.continue_count
    for row in rows:
        assert len(row["prompt_ids"]) == row["n_prompt_tokens"] == SMALL.continue_context
        assert row["n_reference_tokens"] == SMALL.continue_reference
        assert tokenizer.decode(row["prompt_ids"]) == row["prompt"]


def test_deterministic_atomic_and_loadable(built, prepared, tmp_path):
    out, _ = built
    again = build_prompt_sets(prepared, tmp_path, SMALL)
    for name in ("complete.jsonl", "continue.jsonl"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["complete.jsonl", "continue.jsonl", "manifest.json"]
    assert again["sha256"] == json.loads((out / "manifest.json").read_text())["sha256"]
    data = load_dataset("json", data_files=str(out / "complete.jsonl"), split="train")
    assert {"id", "prompt", "reference", "source"} <= set(data.column_names)
    assert load_prompt_set("continue", out / "continue.jsonl")["id"][0] == "continue-0000"


def test_instruct_rows_go_through_the_chat_template():
    """The `instruct` set's rows are chat prompts: a user turn in the tokenizer's template, the generation prompt
    added; a tokenizer without a template is refused."""
    from transformers import AutoTokenizer

    from specfamily.zoo import zoo_path
    from specfamily.zoo.prompts import prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(zoo_path("zoo:code-target"))
    with pytest.raises(ValueError, match="chat template"):
        prompt_ids("instruct", 1, tokenizer)
    tokenizer.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    first = load_prompt_set("instruct")[0]["prompt"]
    expected = tokenizer(f"[user] {first}\n[assistant] ", add_special_tokens=False)["input_ids"]
    assert prompt_ids("instruct", 32, tokenizer)[0] == expected
