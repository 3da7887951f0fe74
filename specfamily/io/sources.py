"""Where models and datasets come from: a hub name that cannot be reached becomes one line saying what to do."""

from __future__ import annotations

from pathlib import Path


class UnreachableError(OSError):
    """A name that is not a local path and that the hub did not serve (offline, or no such repository)."""


def is_local(name: str) -> bool:
    """Whether ``name`` is a file or folder on this machine."""
    return Path(name).expanduser().exists()


def _reason(err: BaseException) -> str:
    first = str(err).strip().splitlines()
    return f"{type(err).__name__}: {first[0] if first else ''}".rstrip(": ")


def unreachable_model(name: str, err: BaseException) -> UnreachableError:
    """The error for a model name that is neither a local folder nor reachable on the hub."""
    return UnreachableError(
        f"model {name!r} is not a local folder and the model hub did not serve it ({_reason(err)}); "
        f"copy it where the hub is reachable (`hf download {name} --local-dir DIR`) and pass the folder "
        "instead (model.target=DIR, or sf.load_target(DIR)); zoo: names need no hub"
    )


def unreachable_dataset(name: str, err: BaseException) -> UnreachableError:
    """The error for a dataset name that is neither a local file nor reachable on the hub."""
    return UnreachableError(
        f"dataset {name!r} is not a local file and the hub did not serve it ({_reason(err)}); save a copy where "
        "the hub is reachable (e.g. load_dataset(...).to_json('prompts.jsonl')) and use it instead: "
        "dataset=jsonl dataset.data_files=prompts.jsonl"
    )
