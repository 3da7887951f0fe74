"""The matmul kind of a run: every other eval test pins ``model.matmul=exact``; this one runs ``skinny`` and checks
what run.json and the report record, and that the text is the exact run's."""

from __future__ import annotations

import json

from eval_helpers import tiny_overrides

from specfamily.eval.results import PromptRecord, read_records
from specfamily.eval.runner import run_experiment


def _tokens(run_dir) -> list[tuple[str, str, list[int]]]:
    records = read_records(run_dir / "results.jsonl")
    return [(r.drafter, r.prompt_id, r.tokens) for r in records if isinstance(r, PromptRecord)]


def _header_line(run_dir) -> str:
    return next(line for line in (run_dir / "report.md").read_text().splitlines() if " matmul " in line)


def test_a_skinny_run_records_its_matmul_and_writes_the_exact_runs_text(tiny_pair, compose_config, tmp_path):
    exact, skinny = tmp_path / "exact", tmp_path / "skinny"
    run_experiment(compose_config(tiny_overrides(tiny_pair)), exact)
    run_experiment(compose_config(tiny_overrides(tiny_pair, matmul="skinny")), skinny)
    saved = {name: json.loads((run / "run.json").read_text()) for name, run in (("exact", exact), ("skinny", skinny))}
    assert saved["skinny"]["config"]["model"]["matmul"] == "skinny"
    assert (saved["skinny"]["matmul"], saved["skinny"]["matmul_seconds"]) == ("skinny", {})  # chosen, not timed
    assert (saved["exact"]["matmul"], saved["exact"]["matmul_seconds"]) == ("exact", {})
    assert ", matmul skinny; specfamily " in _header_line(skinny) and "auto timed" not in _header_line(skinny)
    assert ", matmul exact; specfamily " in _header_line(exact)
    tokens = _tokens(skinny)
    assert len(tokens) == 6 and all(len(t) == 10 for _, _, t in tokens)  # plain and small_model, 3 prompts each
    assert tokens == _tokens(exact)
    texts = {name: [r.text for r in read_records(run / "results.jsonl") if isinstance(r, PromptRecord)]
             for name, run in (("exact", exact), ("skinny", skinny))}
    assert texts["skinny"] == texts["exact"] and all(texts["skinny"])
