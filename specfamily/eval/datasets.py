"""Prompt sets for experiments, read with ``datasets.load_dataset``.

A dataset config names a hub dataset, a builder with local files, a local file, a shipped zoo prompt set
(``zoo:complete``) or an evaluation set shipped with specfamily (``specfamily:spec_bench``), and how a row becomes a
prompt: a text field, a format template over the row's fields, a field of token ids, a field of user turns or a
``messages`` field (role/content or ShareGPT from/value, :mod:`specfamily.eval.messages`); later turns are asked after
the model's own answers (:mod:`specfamily.io.chat`). Optionally in the chat template: the tokenizer's own, or one
given as a file or a Jinja string, with keyword arguments for it. A category field labels each prompt. Column keys
set to ``auto`` are found in the dataset's columns (:mod:`specfamily.eval.columns`); ``split: auto`` takes test,
validation or train. Loading records the revision and fingerprint (:mod:`specfamily.eval.dataset_source`).
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
from specfamily.eval.columns import is_auto, resolve_columns
from specfamily.eval.dataset_source import PACKAGED, DatasetSource, load_split, revision_of, rows_sha256
from specfamily.eval.messages import chat_question
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
    system: str | None = None  # the conversation's own system message (a messages field's), used with its turns

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
    chat_template: Any = False  # False | True (the tokenizer's) | a template file | a Jinja template string
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the template (e.g. enable_thinking)
    system_prompt: str | None = None
    add_special_tokens: bool = True
    max_prompt_tokens: int | None = None
    max_new_tokens: int = 64
    num_examples: int | None = None
    select: str = "first"
    turns_field: str | None = None
    max_turns: int | None = None
    category_field: str | None = None
    messages_field: str | None = None
    revision: str | None = None  # the hub revision (a commit, branch or tag) to read; null: the default branch

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"dataset {self.name!r}: path must be a non-empty string, got {self.path!r}")
        _check_positive(self.max_new_tokens, "max_new_tokens", self.name)
        for key in ("num_examples", "max_prompt_tokens", "max_turns"):
            if getattr(self, key) is not None:
                _check_positive(getattr(self, key), key, self.name)
        if self.select not in SELECT_MODES:
            raise ValueError(f"dataset {self.name!r}: select must be one of {SELECT_MODES}, got {self.select!r}")
        if self.path in PACKAGED and self.data_files is None:
            raise ValueError(f"dataset {self.name!r}: path {self.path!r} reads the files named by data_files; set "
                             f"dataset.data_files=FILE, or give a file or hub dataset as dataset.path")
        chat_template_text(self.chat_template)  # a missing template file is found before any model loads
        if self.chat_template_kwargs is not None and not isinstance(self.chat_template_kwargs, dict):
            raise ValueError(f"dataset {self.name!r}: chat_template_kwargs must be a mapping, "
                             f"got {self.chat_template_kwargs!r}")
        self._check_prompt_keys()

    def _check_prompt_keys(self) -> None:
        keys = {key: getattr(self, key) for key in ("field", "template", "ids_field", "turns_field", "messages_field")}
        if all(value is None for value in keys.values()):
            raise ValueError(f"dataset {self.name!r}: set field, template, ids_field, turns_field or messages_field")
        if self.select == "per_category" and self.category_field is None:
            raise ValueError(f"dataset {self.name!r}: select per_category needs category_field")
        chat = [key for key in ("turns_field", "messages_field") if keys[key] is not None and not is_auto(keys[key])]
        for key in chat:
            if self.ids_field is not None or self.template is not None or len(chat) > 1:
                raise ValueError(f"dataset {self.name!r}: {key} makes the prompts; unset ids_field, template and "
                                 f"the other of turns_field / messages_field")
            if not self.chat_template and self.max_turns != 1:
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
        if options.get("name") is None:
            options["name"] = default_name(str(options.get("path")))
        return cls(**options)


def default_name(path: str) -> str:
    """A dataset's name from its path: ``spec_bench`` for ``specfamily:spec_bench``, ``gsm8k`` for ``openai/gsm8k``
    or a local folder ``.../gsm8k``, ``prompts`` for ``prompts.jsonl``."""
    tail = path.split(":", 1)[1] if path.startswith((SHIPPED_PREFIX, zoo.ZOO_PREFIX)) else path
    name = Path(tail.rstrip("/")).stem
    return name or path


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



def chat_template_text(value: Any) -> str | None:
    """The chat template a ``chat_template`` value names: None for false/true (none, or the tokenizer's own), else
    the file's text or the Jinja string itself; a ValueError for a string that is neither."""
    if isinstance(value, bool) or value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"chat_template must be true, false, a template file or a Jinja string, got {value!r}")
    if "{{" in value or "{%" in value:
        return value
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise ValueError(f"chat_template {value!r} is neither a file nor a Jinja template (no {{{{ or {{% in it)")


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


def _load(spec: DatasetSpec):
    """(the split, its name, the builder's hash, load_dataset's path and data_files)."""
    from datasets.exceptions import DatasetNotFoundError

    path, data_files = _source(spec)
    try:
        rows, split, builder_hash = load_split(path, spec.config_name, data_files, spec.split, spec.revision)
    except (ConnectionError, DatasetNotFoundError) as err:
        if data_files is not None or is_local(path):
            raise
        raise unreachable_dataset(path, err) from None
    except ValueError as err:  # datasets' "Config name is missing.\nPlease pick one among ...: [...]"
        lines = str(err).splitlines()
        if not lines or not lines[0].startswith("Config name is missing"):
            raise
        choices = lines[1].split(":", 1)[-1].strip() if len(lines) > 1 else "?"
        raise ValueError(f"dataset {spec.name!r}: {path!r} has several configurations {choices}; choose one with "
                         "dataset.config_name=NAME") from None
    return rows, split, builder_hash, path, data_files


def load_rows(spec: DatasetSpec):
    """The split as a ``datasets.Dataset``."""
    return _load(spec)[0]


def resolve_spec(spec: DatasetSpec, rows) -> DatasetSpec:
    """``spec`` with its ``auto`` column keys resolved against ``rows`` (a ``datasets.Dataset`` or a list of dicts)."""
    options = dataclasses.asdict(spec)
    columns = _columns(rows)
    values_of = (lambda c: rows[c]) if hasattr(rows, "column_names") else (lambda c: [row[c] for row in rows])
    try:
        resolved = resolve_columns(options, columns, rows[0] if len(rows) else None, values_of)
    except ValueError as err:
        raise ValueError(f"dataset {spec.name!r}: {err}") from None
    return dataclasses.replace(spec, **{key: resolved[key] for key in options if resolved[key] != options[key]})


def _columns(rows) -> list[str]:
    return list(rows.column_names) if hasattr(rows, "column_names") else list(rows[0]) if len(rows) else []


def _wanted_fields(spec: DatasetSpec) -> list[str]:
    if spec.ids_field is not None:
        wanted = [spec.ids_field]
    elif spec.turns_field is not None:
        wanted = [spec.turns_field]
    elif spec.messages_field is not None:
        wanted = [spec.messages_field]
    elif spec.template is not None:  # "{translation[de]}" reads the column "translation"
        wanted = [name.split("[")[0].split(".")[0] for _, name, _, _ in string.Formatter().parse(spec.template) if name]
    else:
        wanted = [spec.field]
    return wanted + [key for key in (spec.id_field, spec.category_field) if key is not None]


def _question(spec: DatasetSpec, row: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    """The row's user turns (at most ``max_turns``) and its own system message; ((), None) for a single text."""
    if spec.messages_field is not None:
        try:
            question = chat_question(row[spec.messages_field], spec.max_turns)
        except ValueError as err:
            raise ValueError(f"dataset {spec.name!r}: field {spec.messages_field!r}: {err}") from None
        return question.turns, question.system
    if spec.turns_field is None:
        return (), None
    turns = row[spec.turns_field]
    if isinstance(turns, str) or not turns or not all(isinstance(turn, str) for turn in turns):
        raise ValueError(f"dataset {spec.name!r}: field {spec.turns_field!r} must hold a non-empty list of strings, "
                         f"got {turns!r:.80}")
    return tuple(turns[: spec.max_turns]), None


def _chat_ids(spec: DatasetSpec, tokenizer, turns, answers, system: str | None) -> list[int]:
    system = spec.system_prompt if spec.system_prompt is not None else system
    return chat_prompt_ids(tokenizer, turns, answers, system, template=chat_template_text(spec.chat_template),
                           template_kwargs=spec.chat_template_kwargs)


def _encode(spec: DatasetSpec, text: str, tokenizer, system: str | None = None) -> list[int]:
    if spec.chat_template:
        return _chat_ids(spec, tokenizer, [text], (), system)
    return list(tokenizer(text, add_special_tokens=spec.add_special_tokens)["input_ids"])


def _prompt_ids(spec: DatasetSpec, row: dict[str, Any], turns: tuple[str, ...], system, tokenizer) -> list[int]:
    if spec.ids_field is not None:
        return [int(i) for i in row[spec.ids_field]]
    if tokenizer is None:
        raise ValueError(f"dataset {spec.name!r} has text prompts but the target has no tokenizer; set ids_field")
    if turns:
        return _encode(spec, turns[0], tokenizer, system)
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
    return _cut(spec, _chat_ids(spec, tokenizer, turns, answers, prompt.system))


def selected_rows(spec: DatasetSpec, rows) -> list[int]:
    """The indices of the rows ``spec`` selects (its column keys resolved)."""
    if spec.select != "per_category":
        return select_indices(len(rows), spec.num_examples, spec.select)
    field = spec.category_field
    categories = list(rows[field]) if hasattr(rows, "column_names") else [row[field] for row in rows]
    return per_category_indices(categories, spec.num_examples)


def prompts_from_rows(spec: DatasetSpec, rows, tokenizer=None) -> list[Prompt]:
    """Prompts of the selected rows of ``rows`` (a ``datasets.Dataset`` or a list of dicts)."""
    spec = resolve_spec(spec, rows)
    columns = _columns(rows)
    for key in _wanted_fields(spec):
        if key not in columns:
            raise ValueError(f"dataset {spec.name!r} has no field {key!r}; its fields are: {', '.join(columns)}")
    prompts, seen = [], set()
    for index in selected_rows(spec, rows):
        row = rows[index]
        turns, system = _question(spec, row)
        ids = _cut(spec, _prompt_ids(spec, row, turns, system, tokenizer))
        prompt_id = str(row[spec.id_field]) if spec.id_field is not None else str(index)
        if not ids:
            raise ValueError(f"dataset {spec.name!r}: example {prompt_id!r} has an empty prompt")
        if prompt_id in seen:
            raise ValueError(f"dataset {spec.name!r}: id {prompt_id!r} appears twice in field {spec.id_field!r}")
        seen.add(prompt_id)
        category = None if spec.category_field is None else str(row[spec.category_field])
        prompts.append(Prompt(index, prompt_id, ids, category, turns, system))
    return prompts


def load_prompt_set(spec: DatasetSpec, tokenizer=None) -> tuple[list[Prompt], DatasetSource]:
    """Load the dataset, turn the selected rows into prompts and say where they came from."""
    rows, split, builder_hash, path, data_files = _load(spec)
    prompts = prompts_from_rows(spec, rows, tokenizer)
    resolved = resolve_spec(spec, rows)
    keys = ("field", "template", "ids_field", "turns_field", "messages_field", "id_field", "category_field")
    columns = {key: getattr(resolved, key) for key in keys if getattr(resolved, key) is not None}
    source = DatasetSource(
        path=path, config_name=spec.config_name, split=split, data_files=data_files,
        revision=revision_of(path, data_files, spec.revision, builder_hash),
        fingerprint=getattr(rows, "_fingerprint", None), rows=len(rows),
        rows_sha256=rows_sha256(rows, [p.index for p in prompts], _wanted_fields(resolved)), columns=columns,
    )
    return prompts, source


def load_prompts(spec: DatasetSpec, tokenizer=None) -> list[Prompt]:
    """Load the dataset and turn the selected rows into prompts."""
    return load_prompt_set(spec, tokenizer)[0]
