"""``auto`` column keys of a dataset config, resolved against the dataset's own columns (pure functions).

A key set to ``auto`` is looked up by the names datasets on the hub use: the prompt is a ``messages`` column
(role/content or ShareGPT from/value), else a column of user turns (a list of strings: Spec-Bench's ``turns``,
MT-bench's ``prompt``), else a text column (``prompt``, ``question``, ``instruction``, ...; else the only text
column). The id column is the first unique one of ``id``, ``question_id``, ...; the category column is
``category`` when there is one. A key naming a column is used as it is (a missing one is an error, never a guess).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specfamily.eval.messages import is_messages

AUTO = "auto"
PROMPT_KEYS = ("field", "turns_field", "messages_field")  # the keys auto-detection picks one of
SOURCE_KEYS = ("field", "template", "ids_field", "turns_field", "messages_field")  # every way to make a prompt
MESSAGES_NAMES = ("messages", "conversations", "conversation", "chat", "dialog")
TURNS_NAMES = ("turns", "prompt", "prompts")
TEXT_NAMES = ("prompt", "question", "instruction", "input", "query", "problem", "text", "content", "article")
ID_NAMES = ("id", "question_id", "prompt_id", "task_id", "uid", "idx")
CATEGORY_NAMES = ("category",)


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


def _is_turns(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(turn, str) for turn in value)


def detect_prompt_key(columns: Sequence[str], row: dict[str, Any]) -> tuple[str, str]:
    """(the key, the column) that makes the prompts of a dataset whose first row is ``row``; a ValueError otherwise."""
    ordered = list(MESSAGES_NAMES) + [c for c in columns if c not in MESSAGES_NAMES]
    for column in ordered:
        if column in row and is_messages(row[column]):
            return "messages_field", column
    for column in TURNS_NAMES:
        if column in row and _is_turns(row[column]):
            return "turns_field", column
    for column in TEXT_NAMES:
        if isinstance(row.get(column), str):
            return "field", column
    texts = [column for column in columns if isinstance(row.get(column), str)]
    if len(texts) == 1:
        return "field", texts[0]
    raise ValueError(
        f"no prompt column found among {', '.join(columns)}: looked for a messages column "
        f"({', '.join(MESSAGES_NAMES)}),"
        f" a list of user turns ({', '.join(TURNS_NAMES)}) and one text column ({', '.join(TEXT_NAMES)}); "
        "name it with dataset.field=COLUMN (or turns_field, messages_field, template)"
    )


def detect_id_column(columns: Sequence[str], values_of) -> str | None:
    """The first of :data:`ID_NAMES` the dataset has whose values are all distinct (``values_of(column)``), or None."""
    for column in ID_NAMES:
        if column in columns:
            values = [str(value) for value in values_of(column)]
            if len(set(values)) == len(values):
                return column
    return None


def resolve_columns(
    options: dict[str, Any], columns: Sequence[str], first_row: dict[str, Any] | None, values_of
) -> dict[str, Any]:
    """The column keys of ``options`` with every ``auto`` replaced by a column of the dataset (or None).

    The prompt is detected from ``first_row`` (None: an empty dataset); ``values_of(column)`` returns a column's
    values. A prompt key set explicitly (any of :data:`SOURCE_KEYS` other than ``auto`` or None) turns the prompt
    keys left at ``auto`` off. ``select: per_category`` over a dataset without a category column becomes ``spread``.
    """
    resolved = dict(options)
    explicit = [key for key in SOURCE_KEYS if options.get(key) is not None and not is_auto(options.get(key))]
    autos = [key for key in PROMPT_KEYS if is_auto(options.get(key))]
    for key in autos:
        resolved[key] = None
    if autos and not explicit:
        if first_row is None:
            raise ValueError("the dataset has no rows")
        key, column = detect_prompt_key(columns, first_row)
        resolved[key] = column
    if is_auto(options.get("id_field")):
        resolved["id_field"] = detect_id_column(columns, values_of)
    if is_auto(options.get("category_field")):
        resolved["category_field"] = next((c for c in CATEGORY_NAMES if c in columns), None)
        if resolved["category_field"] is None and options.get("select") == "per_category":
            resolved["select"] = "spread"
    return resolved
