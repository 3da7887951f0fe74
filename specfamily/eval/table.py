"""A run's records as a table: ``sf.load_run(run_dir)`` -> ``datasets.Dataset`` (``.to_pandas()`` for pandas).

One row per drafter (or plain decoding) and prompt turn, in the order of ``results.jsonl``. Columns: the record's
fields (``run``, relative to the folder asked for, ``drafter``, ``dataset``, ``prompt_id``, ``turn``, ``prompt``,
``text``, ``tokens``, ...); every metric of :class:`specfamily.Metrics` under its own name; and, against plain
decoding on the same prompt in the same run, ``identical_to_plain`` and ``speedup`` (null without a plain record).
Failures and noise repeats are not rows. A sweep folder gives the rows of every run below it.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from specfamily.eval.results import PromptRecord, read_run

_RECORD_FEATURES = {
    "run": "string", "drafter": "string", "dataset": "string", "sampling": "string", "prompt_id": "string",
    "index": "int64", "turn": "int64", "category": "string", "seed": "int64", "gamma": "int64",
    "prompt": "string", "text": "string", "prompt_tokens": "int64", "tokens": ["int64"],
    "wall_seconds": "float64", "lossy": "bool", "rank": "int64",
}
_METRIC_FEATURES = {
    "new_tokens": "int64", "target_passes": "int64", "draft_steps": "int64", "proposed_tokens": "int64",
    "accepted_tokens": "int64", "acceptance_rate": "float64", "draft_acceptance": "float64",
    "mean_accepted_length": "float64", "per_position_acceptance": ["float64"],
    "conditional_acceptance": ["float64"], "draft_seconds": "float64",
    "verify_seconds": "float64", "other_seconds": "float64", "total_seconds": "float64", "c": "float64",
    "time_to_first_token": "float64", "decode_seconds": "float64", "token_latency_p50": "float64",
    "token_latency_p90": "float64", "token_latency_p99": "float64", "peak_memory_bytes": "int64",
    "peak_memory_kind": "string",
}
_DERIVED_FEATURES = {"identical_to_plain": "bool", "speedup": "float64"}
_DROPPED_METRICS = {"lossy"}  # the record's own lossy column says the same


def _feature(kind: str | list[str]):
    from datasets import List, Value

    return List(Value(kind[0])) if isinstance(kind, list) else Value(kind)


def _throughput(record: PromptRecord) -> float | None:
    return record.metrics["new_tokens"] / record.wall_seconds if record.wall_seconds > 0 else None


def record_row(record: PromptRecord, plain: PromptRecord | None, run: str = ".") -> dict[str, Any]:
    """One table row: the record's fields, its metrics flattened, and its comparison with plain decoding."""
    fields = asdict(record)
    metrics = fields.pop("metrics")
    row = {"run": run, **{key: fields.get(key) for key in _RECORD_FEATURES if key != "run"}}
    for key, value in metrics.items():
        if key not in _DROPPED_METRICS:
            row[key if key not in row else f"metric_{key}"] = value
    if plain is None:
        return {**row, "identical_to_plain": None, "speedup": None}
    mine, base = _throughput(record), _throughput(plain)
    return {**row, "identical_to_plain": record.tokens == plain.tokens,
            "speedup": mine / base if mine is not None and base else None}


def run_rows(folder: Path, run: str = ".") -> list[dict[str, Any]]:
    """The table rows of one run folder."""
    from specfamily.eval.config import PLAIN

    records = [r for r in read_run(folder) if isinstance(r, PromptRecord)]
    plain = {r.prompt_id: r for r in records if r.drafter == PLAIN}
    return [record_row(r, plain.get(r.prompt_id), run) for r in records]


def _features(rows: list[dict[str, Any]]):
    from datasets import Dataset, Features

    kinds = {**_RECORD_FEATURES, **_METRIC_FEATURES, **_DERIVED_FEATURES}
    columns = list(dict.fromkeys([*_RECORD_FEATURES, *_METRIC_FEATURES, *(k for r in rows for k in r),
                                  *_DERIVED_FEATURES]))
    features = {}
    for column in columns:
        if column in kinds:
            features[column] = _feature(kinds[column])
        else:  # a metric this module does not know yet: let datasets infer its type
            features[column] = Dataset.from_dict({column: [r.get(column) for r in rows]}).features[column]
    return Features(features)


def load_run(run_dir: str | Path):
    """A run's rows (prompt, text, tokens, metrics) as a ``datasets.Dataset``; a sweep folder: every run's rows.

    Raises FileNotFoundError when ``run_dir`` holds no run (no ``run.json`` in it or below it).
    """
    from datasets import Dataset

    from specfamily.eval.report import find_runs

    folder = Path(run_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; sf.load_run takes a run (or sweep) folder")
    rows = []
    for run in find_runs(folder):
        rows += run_rows(run, run.relative_to(folder).as_posix() if run != folder else ".")
    features = _features(rows)
    return Dataset.from_dict({name: [row.get(name) for row in rows] for name in features}, features=features)
