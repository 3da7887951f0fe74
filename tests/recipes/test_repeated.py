"""The repeated-task workload: rows grouped by instruction, written as JSON lines the jsonl dataset reads."""

from __future__ import annotations

import ast
import json

import pytest

from specfamily.recipes.repeated import INSTRUCTIONS, heldout_functions, main, repeated_task_rows, write_jsonl

FUNCTIONS = ["def f():\n    return 1", "def g(x):\n    return x", "def h(y):\n    return -y"]


def test_rows_ask_every_instruction_about_the_same_functions_grouped_by_task():
    rows = repeated_task_rows(FUNCTIONS, 2, offset=1)
    assert [row["category"] for row in rows] == ["docstring", "docstring", "explain", "explain", "tests", "tests"]
    assert [row["question_id"] for row in rows[:2]] == ["docstring-1", "docstring-2"]
    assert rows[0]["turns"] == [INSTRUCTIONS["docstring"].format(code=FUNCTIONS[1])]
    assert rows[3]["turns"] == [INSTRUCTIONS["explain"].format(code=FUNCTIONS[2])]


def test_bad_requests_are_refused():
    with pytest.raises(ValueError, match="per_task must be >= 1, got 0"):
        repeated_task_rows(FUNCTIONS, 0)
    with pytest.raises(ValueError, match="3 functions wanted from offset 1, only 2 available"):
        repeated_task_rows(FUNCTIONS, 3, offset=1)
    with pytest.raises(ValueError, match="instruction 'x' has no {code} field"):
        repeated_task_rows(FUNCTIONS, 1, {"x": "no code"})


def test_heldout_functions_parse_and_the_cli_writes_them(tmp_path):
    found = heldout_functions(limit=5)
    assert len(found) == 5
    for code in found:
        assert isinstance(ast.parse(code).body[0], ast.FunctionDef | ast.AsyncFunctionDef)
        assert 5 <= len(code.splitlines()) <= 16
    out = tmp_path / "repeated.jsonl"
    assert main([str(out), "--per-task", "2", "--offset", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == repeated_task_rows(found, 2, offset=3)
    assert write_jsonl(tmp_path / "x.jsonl", rows[:1]).read_text() == json.dumps(rows[0]) + "\n"
