"""Prompt sets for experiments, read with ``datasets.load_dataset``.

A dataset config names a hub dataset, a builder with local files, a local file, a shipped zoo prompt set
(``zoo:complete``) or an evaluation set shipped with specfamily (``specfamily:spec_bench``), and how a row becomes a
prompt: a text field, a format template over the row's fields, a field of token ids, or a field of user turns (later
turns asked after the model's own answers, :mod:`specfamily.io.chat`); optionally in the chat template. A category
field labels each prompt.
"""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specfamily import zoo
from specfamily.io.chat import chat_prompt_ids
from specfamily.io.sources import is_local, unreachable_dataset

SELECT_MODES = ("first", "spread", "per_category")
SHIPPED_PREFIX = "specfamily:"
SHIPPED_SETS = {"spec_bench": ("spec_bench", "question.jsonl")}  # name -> file under specfamily/eval/data
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Prompt:
    """One example: its index in the split (stable across runs and ranks), its id and turn 1's token ids.

    ``turns`` holds a chat question's user turns (empty for a single-text prompt); turns after the
    first are built at run time from the arm's own answers (:func:`turn_prompt_ids`).
    """

    index: int
    id: str
    ids: list[int]
    category: str | None = None
    turns: tuple[str, ...] = ()

    @property
    def n_turns(self) -> int:
        return max(1, len(self.turns))


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
    turns_field: str | None = None
    max_turns: int | None = None
    category_field: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"dataset {self.name!r}: path must be a non-empty string, got {self.path!r}")
        _check_positive(self.max_new_tokens, "max_new_tokens", self.name)
        for key in ("num_examples", "max_prompt_tokens", "max_turns"):
            if getattr(self, key) is not None:
                _check_positive(getattr(self, key), key, self.name)
        if self.select not in SELECT_MODES:
            raise ValueError(f"dataset {self.name!r}: select must be one of {SELECT_MODES}, got {self.select!r}")
        if self.select == "per_category" and self.category_field is None:
            raise ValueError(f"dataset {self.name!r}: select per_category needs category_field")
        if self.field is None and self.template is None and self.ids_field is None and self.turns_field is None:
            raise ValueError(f"dataset {self.name!r}: set field, template, ids_field or turns_field")
        if self.turns_field is not None and (self.ids_field is not None or self.template is not None):
            raise ValueError(f"dataset {self.name!r}: turns_field makes the prompts; unset ids_field and template")
        if self.turns_field is not None and not self.chat_template and self.max_turns != 1:
            raise ValueError(
                f"dataset {self.name!r}: later turns are asked through the chat template; "
                "set chat_template: true, or max_turns: 1 to keep first turns only"
            )

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


def per_category_indices(categories: list[Any], per_category: int | None) -> list[int]:
    """Row indices of ``per_category`` rows of every category (all: None), evenly spaced within it, in row order."""
    groups: dict[Any, list[int]] = {}
    for index, category in enumerate(categories):
        groups.setdefault(category, []).append(index)
    picked = [rows[i] for rows in groups.values() for i in select_indices(len(rows), per_category, "spread")]
    return sorted(picked)


def shipped_set_path(name: str) -> Path:
    """The file of an evaluation set shipped with specfamily (``specfamily:<name>``), e.g. ``spec_bench``."""
    if name not in SHIPPED_SETS:
        raise ValueError(f"unknown shipped prompt set {name!r}; shipped: {', '.join(SHIPPED_SETS)}")
    node = resources.files("specfamily").joinpath("eval", "data", *SHIPPED_SETS[name])
    if not isinstance(node, Path) or not node.is_file():
        raise FileNotFoundError(f"shipped prompt set {name!r} is missing from this installation ({node})")
    return node


def _source(spec: DatasetSpec) -> tuple[str, Any]:
    """(load_dataset path, data_files): zoo sets, shipped sets and bare local files become builder + file."""
    if zoo.is_zoo_name(spec.path):
        return "json", str(zoo.prompt_set_path(spec.path[len(zoo.ZOO_PREFIX) :]))
    if spec.path.startswith(SHIPPED_PREFIX):
        return "json", str(shipped_set_path(spec.path[len(SHIPPED_PREFIX) :]))
    path = Path(spec.path)
    if spec.data_files is None and path.suffix in _BUILDERS and path.is_file():
        return _BUILDERS[path.suffix], str(path)
    return spec.path, spec.data_files


def load_rows(spec: DatasetSpec):
    """The split as a ``datasets.Dataset``."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetNotFoundError

    path, data_files = _source(spec)
    try:
        return load_dataset(path, name=spec.config_name, data_files=data_files, split=spec.split)
    except (ConnectionError, DatasetNotFoundError) as err:
        if data_files is not None or is_local(path):
            raise
        raise unreachable_dataset(path, err) from None


def _wanted_fields(spec: DatasetSpec) -> list[str]:
    if spec.ids_field is not None:
        wanted = [spec.ids_field]
    elif spec.turns_field is not None:
        wanted = [spec.turns_field]
    elif spec.template is not None:
        wanted = [name for _, name, _, _ in string.Formatter().parse(spec.template) if name]
    else:
        wanted = [spec.field]
    return wanted + [key for key in (spec.id_field, spec.category_field) if key is not None]


def _turns(spec: DatasetSpec, row: dict[str, Any]) -> tuple[str, ...]:
    """The row's user turns (at most ``max_turns``); () when the dataset has no turns field."""
    if spec.turns_field is None:
        return ()
    turns = row[spec.turns_field]
    if isinstance(turns, str) or not turns or not all(isinstance(turn, str) for turn in turns):
        raise ValueError(f"dataset {spec.name!r}: field {spec.turns_field!r} must hold a non-empty list of strings, "
                         f"got {turns!r:.80}")
    return tuple(turns[: spec.max_turns])


def _encode(spec: DatasetSpec, text: str, tokenizer) -> list[int]:
    if spec.chat_template:
        return chat_prompt_ids(tokenizer, [text], (), spec.system_prompt)
    return list(tokenizer(text, add_special_tokens=spec.add_special_tokens)["input_ids"])


def _prompt_ids(spec: DatasetSpec, row: dict[str, Any], turns: tuple[str, ...], tokenizer) -> list[int]:
    if spec.ids_field is not None:
        return [int(i) for i in row[spec.ids_field]]
    if tokenizer is None:
        raise ValueError(f"dataset {spec.name!r} has text prompts but the target has no tokenizer; set ids_field")
    if turns:
        return _encode(spec, turns[0], tokenizer)
    text = spec.template.format(**row) if spec.template is not None else str(row[spec.field])
    return _encode(spec, text, tokenizer)


def _cut(spec: DatasetSpec, ids: list[int]) -> list[int]:
    return ids[-spec.max_prompt_tokens :] if spec.max_prompt_tokens is not None else ids


def turn_prompt_ids(spec: DatasetSpec, prompt: Prompt, answers: list[str], tokenizer) -> list[int]:
    """Token ids of turn ``len(answers) + 1`` of ``prompt``: its user turns so far with the model's own answers."""
    if not answers:
        return prompt.ids
    if len(answers) >= prompt.n_turns:
        raise ValueError(f"prompt {prompt.id!r} has {prompt.n_turns} turn(s); no turn {len(answers) + 1}")
    turns = prompt.turns[: len(answers) + 1]
    return _cut(spec, chat_prompt_ids(tokenizer, turns, answers, spec.system_prompt))


def prompts_from_rows(spec: DatasetSpec, rows, tokenizer=None) -> list[Prompt]:
    """Prompts of the selected rows of ``rows`` (a ``datasets.Dataset`` or a list of dicts)."""
    columns = list(rows.column_names) if hasattr(rows, "column_names") else list(rows[0]) if len(rows) else []
    for key in _wanted_fields(spec):
        if key not in columns:
            raise ValueError(f"dataset {spec.name!r} has no field {key!r}; its fields are: {', '.join(columns)}")
    if spec.select == "per_category":
        field = spec.category_field
        categories = list(rows[field]) if hasattr(rows, "column_names") else [row[field] for row in rows]
        selected = per_category_indices(categories, spec.num_examples)
    else:
        selected = select_indices(len(rows), spec.num_examples, spec.select)
    prompts, seen = [], set()
    for index in selected:
        row = rows[index]
        turns = _turns(spec, row)
        ids = _cut(spec, _prompt_ids(spec, row, turns, tokenizer))
        prompt_id = str(row[spec.id_field]) if spec.id_field is not None else str(index)
        if not ids:
            raise ValueError(f"dataset {spec.name!r}: example {prompt_id!r} has an empty prompt")
        if prompt_id in seen:
            raise ValueError(f"dataset {spec.name!r}: id {prompt_id!r} appears twice in field {spec.id_field!r}")
        seen.add(prompt_id)
        category = None if spec.category_field is None else str(row[spec.category_field])
        prompts.append(Prompt(index, prompt_id, ids, category, turns))
    return prompts


def load_prompts(spec: DatasetSpec, tokenizer=None) -> list[Prompt]:
    """Load the dataset and turn the selected rows into prompts."""
    return prompts_from_rows(spec, load_rows(spec), tokenizer)
