"""Prompt sets for experiments, read with ``datasets.load_dataset``.

A dataset config names a hub dataset, a builder with local files (json/jsonl, csv, parquet), a
local file directly, or a shipped zoo prompt set (``zoo:complete``, ``zoo:continue``), and says
how to make a prompt of each row: a text field, a format template over the row's fields, or a
field of ready token ids; optionally wrapped in the tokenizer's chat template.
"""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

SELECT_MODES = ("first", "spread")
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Prompt:
    """One example: its index in the split (stable across runs and ranks), its id and token ids."""

    index: int
    id: str
    ids: list[int]


@dataclass(frozen=True)
class DatasetSpec:
    """The ``dataset`` config group's schema (see ``configs/dataset/complete.yaml`` for each key)."""

    name: str
    path: str
    data_files: Any = None
    config_name: str | None = None
    split: str = "train"
    field: str | None = "prompt"
    template: str | None = None
    ids_field: str | None = None
    id_field: str | None = None
    chat_template: bool = False
    system_prompt: str | None = None
    add_special_tokens: bool = True
    max_prompt_tokens: int | None = None
    max_new_tokens: int = 64
    num_examples: int | None = None
    select: str = "first"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"dataset {self.name!r}: path must be a non-empty string, got {self.path!r}")
        _check_positive(self.max_new_tokens, "max_new_tokens", self.name)
        for key in ("num_examples", "max_prompt_tokens"):
            if getattr(self, key) is not None:
                _check_positive(getattr(self, key), key, self.name)
        if self.select not in SELECT_MODES:
            raise ValueError(f"dataset {self.name!r}: select must be one of {SELECT_MODES}, got {self.select!r}")
        if self.field is None and self.template is None and self.ids_field is None:
            raise ValueError(f"dataset {self.name!r}: set field, template or ids_field")

    @classmethod
    def from_config(cls, node: DictConfig | dict) -> DatasetSpec:
        """Build from a config node; an unknown key is a TypeError naming it and the valid ones."""
        options = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(f"dataset config got unknown key(s) {unknown}; valid keys: {', '.join(valid)}")
        options.setdefault("name", str(options.get("path")))
        return cls(**options)


def _check_positive(value: Any, key: str, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"dataset {name!r}: {key} must be an integer >= 1, got {value!r}")


def select_indices(n_rows: int, num_examples: int | None, select: str = "first") -> list[int]:
    """Row indices to use: the first ``num_examples``, or that many evenly spaced over the split."""
    k = n_rows if num_examples is None else min(num_examples, n_rows)
    if select == "first":
        return list(range(k))
    if select == "spread":
        return [i * n_rows // k for i in range(k)]
    raise ValueError(f"select must be one of {SELECT_MODES}, got {select!r}")


def _source(spec: DatasetSpec) -> tuple[str, Any]:
    """(load_dataset path, data_files): zoo sets and bare local files become builder + file."""
    if spec.path.startswith("zoo:"):
        from specfamily.zoo import prompt_set_path

        return "json", str(prompt_set_path(spec.path[len("zoo:") :]))
    path = Path(spec.path)
    if spec.data_files is None and path.suffix in _BUILDERS and path.is_file():
        return _BUILDERS[path.suffix], str(path)
    return spec.path, spec.data_files


def load_rows(spec: DatasetSpec):
    """The split as a ``datasets.Dataset``."""
    from datasets import load_dataset

    path, data_files = _source(spec)
    return load_dataset(path, name=spec.config_name, data_files=data_files, split=spec.split)


def _check_fields(spec: DatasetSpec, columns: list[str], wanted: list[str]) -> None:
    for key in wanted:
        if key not in columns:
            raise ValueError(f"dataset {spec.name!r} has no field {key!r}; its fields are: {', '.join(columns)}")


def _template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def _wanted_fields(spec: DatasetSpec) -> list[str]:
    if spec.ids_field is not None:
        wanted = [spec.ids_field]
    elif spec.template is not None:
        wanted = _template_fields(spec.template)
    else:
        wanted = [spec.field]
    return wanted + ([spec.id_field] if spec.id_field is not None else [])


def _text(spec: DatasetSpec, row: dict[str, Any]) -> str:
    return spec.template.format(**row) if spec.template is not None else str(row[spec.field])


def _encode(spec: DatasetSpec, text: str, tokenizer) -> list[int]:
    if spec.chat_template:
        messages = [{"role": "system", "content": spec.system_prompt}] if spec.system_prompt else []
        messages.append({"role": "user", "content": text})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text, add_special_tokens=spec.add_special_tokens)["input_ids"])


def _prompt_ids(spec: DatasetSpec, row: dict[str, Any], tokenizer) -> list[int]:
    if spec.ids_field is not None:
        return [int(i) for i in row[spec.ids_field]]
    if tokenizer is None:
        raise ValueError(f"dataset {spec.name!r} has text prompts but the target has no tokenizer; set ids_field")
    return _encode(spec, _text(spec, row), tokenizer)


def prompts_from_rows(spec: DatasetSpec, rows, tokenizer=None) -> list[Prompt]:
    """Prompts of the selected rows of ``rows`` (a ``datasets.Dataset`` or a list of dicts)."""
    columns = list(rows.column_names) if hasattr(rows, "column_names") else list(rows[0]) if len(rows) else []
    _check_fields(spec, columns, _wanted_fields(spec))
    prompts, seen = [], set()
    for index in select_indices(len(rows), spec.num_examples, spec.select):
        row = rows[index]
        ids = _prompt_ids(spec, row, tokenizer)
        if spec.max_prompt_tokens is not None:
            ids = ids[-spec.max_prompt_tokens :]
        prompt_id = str(row[spec.id_field]) if spec.id_field is not None else str(index)
        if not ids:
            raise ValueError(f"dataset {spec.name!r}: example {prompt_id!r} has an empty prompt")
        if prompt_id in seen:
            raise ValueError(f"dataset {spec.name!r}: id {prompt_id!r} appears twice in field {spec.id_field!r}")
        seen.add(prompt_id)
        prompts.append(Prompt(index, prompt_id, ids))
    return prompts


def load_prompts(spec: DatasetSpec, tokenizer=None) -> list[Prompt]:
    """Load the dataset and turn the selected rows into prompts."""
    return prompts_from_rows(spec, load_rows(spec), tokenizer)
