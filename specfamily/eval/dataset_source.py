"""Loading a dataset's split and recording where it came from: the revision and fingerprint ``run.json`` keeps.

The revision is the hub commit a hub dataset was read at (pinned with ``dataset.revision``, else the one the hub
served), or, for a local folder, the commit of the copy: a ``git clone`` of the dataset repository, or a folder
written by ``hf download --local-dir`` (whose download metadata names the commit). The fingerprint is the one
``datasets`` gives the loaded split (it changes with the files' content); the rows hash is sha256 over the rows the
prompts were made from, so two runs can be checked for the same prompt text whatever the tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AUTO_SPLITS = ("test", "validation", "train")  # split=auto: the first the dataset has, else one named after it
COMMIT = re.compile(r"[0-9a-f]{40}")
PACKAGED = ("json", "csv", "parquet", "text", "arrow")  # builders that read files named by data_files
HF_DOWNLOAD_METADATA = Path(".cache", "huggingface", "download")


@dataclass(frozen=True)
class DatasetSource:
    """Where a run's prompts came from (``run.json``'s ``dataset_source``)."""

    path: str  # what load_dataset read: a hub name, a local folder or file, or a builder (json, csv, parquet)
    config_name: str | None
    split: str
    data_files: Any = None
    revision: str | None = None  # a commit (hub or local copy); None: not known (a plain local file)
    fingerprint: str | None = None  # datasets' fingerprint of the loaded split
    rows: int = 0  # rows in the split
    rows_sha256: str | None = None  # sha256 of the selected rows' prompt columns, in order
    columns: dict[str, Any] = field(default_factory=dict)  # the column keys the prompts were made with (auto resolved)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def pick_split(splits: list[str], split: str) -> str:
    """``split`` itself, or for ``auto`` the first of :data:`AUTO_SPLITS` the dataset has (else its only split)."""
    if split != "auto":
        return split
    for name in AUTO_SPLITS:
        if name in splits:
            return name
    for name in AUTO_SPLITS:  # test_sft, validation_matched, ...
        named = [s for s in splits if s.startswith(name)]
        if named:
            return named[0]
    if len(splits) == 1:
        return splits[0]
    raise ValueError(f"split auto: the dataset has none of {', '.join(AUTO_SPLITS)} but {', '.join(splits)}; "
                     "choose one with dataset.split=NAME")


def load_split(path: str, config_name: str | None, data_files: Any, split: str, revision: str | None):
    """(the split as a ``datasets.Dataset``, its name, the builder's hash): what ``load_dataset`` does, step by step,
    so the split can be chosen from the ones the dataset has and the hub commit read from the builder."""
    from datasets import load_dataset_builder

    builder = load_dataset_builder(path, name=config_name, data_files=data_files, revision=revision)
    builder.download_and_prepare()
    splits = list(builder.info.splits or {})
    chosen = pick_split(splits, split)
    if splits and chosen not in splits:
        raise ValueError(f"dataset {path!r} has no split {chosen!r}; its splits are: {', '.join(splits)}")
    return builder.as_dataset(split=chosen), chosen, builder.hash


def local_revision(folder: Path) -> str | None:
    """The commit of a local copy of a dataset repository: its git HEAD, else the one ``hf download`` recorded."""
    if (folder / ".git").exists():
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
            return head or None
        except (OSError, subprocess.SubprocessError):
            return None
    commits = set()
    for metadata in (folder / HF_DOWNLOAD_METADATA).rglob("*.metadata"):
        first = metadata.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
        if first and COMMIT.fullmatch(first[0].strip()):
            commits.add(first[0].strip())
    return commits.pop() if len(commits) == 1 else None


def revision_of(path: str, data_files: Any, pinned: str | None, builder_hash: str | None) -> str | None:
    """The revision of what was read (see the module's docstring); None when it is not known."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local_revision(local)
    if local.exists() or path in PACKAGED or data_files is not None:
        return None
    if builder_hash and COMMIT.fullmatch(builder_hash):
        return builder_hash
    return pinned


def rows_sha256(rows, indices: list[int], columns: list[str]) -> str:
    """sha256 over the given rows' values of ``columns`` (JSON, in order)."""
    digest = hashlib.sha256()
    for index in indices:
        row = rows[index]
        digest.update(json.dumps([row[c] for c in columns], sort_keys=True, default=str).encode() + b"\n")
    return digest.hexdigest()
