"""The zoo's shipped held-out prompt sets, read: ``load_prompt_set`` (a ``datasets.Dataset``) and ``prompt_ids``
(token ids of prompts spread evenly over a set). How they were built: ``specfamily.recipes.prompt_sets``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specfamily.zoo import paths

PROMPT_SETS = ("complete", "continue", "instruct")  # instruct: chat prompts written here, none from an eval set


def evenly(items: Sequence, count: int) -> list:
    """``count`` items spread evenly over ``items`` in order (all of them if there are fewer)."""
    if count >= len(items):
        return list(items)
    if count <= 0:
        return []
    return [items[i] for i in np.linspace(0, len(items) - 1, num=count).round().astype(int)]


def load_prompt_set(name: str, path: Path | None = None):
    """A shipped (or given) prompt set as a ``datasets.Dataset``."""
    from datasets import load_dataset

    file = Path(path) if path is not None else prompt_set_path(name)
    return load_dataset("json", data_files=str(file), split="train")


def prompt_ids(name: str, count: int | None, tokenizer=None, last: int | None = None) -> list[list[int]]:
    """Token ids of ``count`` prompts spread evenly over a shipped prompt set (all of them for None), each cut
    to its ``last`` tokens when given; rows without ``prompt_ids`` are tokenised with ``tokenizer`` (rows marked
    ``chat`` through its chat template)."""
    data = load_prompt_set(name)
    rows = range(len(data)) if count is None or count >= len(data) else evenly(range(len(data)), count)
    ids = []
    for i in rows:
        row = data[int(i)]
        if row.get("prompt_ids") is not None:
            ids.append(list(row["prompt_ids"]))
        elif tokenizer is None:
            raise ValueError(f"prompt set {name!r} has no prompt_ids; pass the target's tokenizer")
        else:
            ids.append(_encode(row, tokenizer))
    return [p[-last:] for p in ids] if last else ids


def _encode(row: dict, tokenizer) -> list[int]:
    """A row's text as token ids; rows marked ``chat`` become a user turn in the tokenizer's chat template."""
    if row.get("chat"):
        from specfamily.io.chat import chat_prompt_ids

        return chat_prompt_ids(tokenizer, [row["prompt"]])
    return list(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])


def prompt_set_path(name: str) -> Path:
    """The shipped jsonl file of a held-out prompt set (``"complete"`` or ``"continue"``)."""
    if not isinstance(name, str):
        raise TypeError(f"prompt set name must be a string, got {type(name).__name__}")
    if name not in PROMPT_SETS:
        raise paths.unknown_name("zoo prompt set", name, name, PROMPT_SETS)
    path = paths.package_dir("data", "prompts", f"{name}.jsonl")
    if not path.is_file():
        raise FileNotFoundError(
            f"zoo prompt set {name!r} is not shipped with this installation (no {path}); "
            "build it with `specfamily-zoo prompts --workdir work/zoo --out specfamily/zoo/data/prompts`"
        )
    return path
