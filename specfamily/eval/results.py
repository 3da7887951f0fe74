"""Results on disk: one JSON line per finished prompt (or failure), appended and flushed as it happens.

A run folder holds ``run.json`` (resolved config, seed, environment, weights hash, prompts' fingerprint, verify cost,
noise checks), ``results.jsonl`` and ``repeats.jsonl``. Under torchrun each rank appends to its own
``results.rank<r>.jsonl`` (``repeats.rank<r>.jsonl``); :func:`consolidate` merges them in a fixed order. Whole files
are written atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specfamily.io.files import write_text_atomically

RESULTS = "results.jsonl"
RUN_INFO = "run.json"
RANK_GLOB = "results.rank*.jsonl"
REPEATS_GLOB = "repeats*.jsonl"


@dataclass
class PromptRecord:
    """One drafter (or plain decoding) on one prompt."""

    drafter: str  # label: "plain" or the drafter's name
    dataset: str
    sampling: str
    prompt_id: str
    index: int  # the prompt's index in the dataset split
    seed: int
    gamma: int | None  # the drafter's (starting) draft length; None for plain decoding
    prompt_tokens: int
    tokens: list[int]  # the new tokens
    wall_seconds: float  # sf.generate's wall time, drafter.begin included
    lossy: bool
    metrics: dict[str, Any]  # Metrics.as_dict()
    rank: int = 0
    kind: str = "prompt"
    category: str | None = None  # the prompt's category when the dataset has a category field
    turn: int = 1  # the turn of a multi-turn prompt (prompt_id "<id>:turn<t>" after the first)
    prompt: str | None = None  # the prompt as the model saw it (decoded ids, chat template included)
    text: str | None = None  # the new tokens decoded (special tokens kept); None without a tokenizer
    trace: dict[str, Any] | None = None  # every pass (specfamily.core.trace.Trace.as_dict); None with trace: false
    pieces: list[str] | None = None  # each new token's share of ``text`` (eval.pieces); None without a tokenizer
    batch: dict[str, Any] | None = None  # a batched run's request (eval.batched); None (and not written): batch 1

    @property
    def key(self) -> tuple[str, str]:
        return (self.drafter, self.prompt_id)


@dataclass
class FailureRecord:
    """A drafter that raised: while being built, warming up or generating (then ``prompt_id`` is set)."""

    drafter: str
    stage: str  # create | warmup | generate
    error: str  # "ExceptionType: message"
    traceback: str = ""
    prompt_id: str | None = None
    index: int | None = None
    rank: int = 0
    kind: str = "failure"


@dataclass
class RepeatRecord:
    """Plain decoding re-timed on a rank's first prompt during the run: the run's own noise measurement."""

    prompt_id: str
    index: int
    repeat: int  # 1, 2, ...: the k-th re-timing (the prompt's own plain record is the 0th)
    after: int  # how many of the rank's prompts were finished when it ran
    tokens: list[int]
    wall_seconds: float
    rank: int = 0
    kind: str = "repeat"


Record = PromptRecord | FailureRecord
_KINDS = {"prompt": PromptRecord, "failure": FailureRecord, "repeat": RepeatRecord}


def record_json(record: Record | RepeatRecord) -> str:
    """One JSON line; a batch-1 record leaves out ``batch`` (its lines are what they were before batched runs)."""
    data = asdict(record)
    if data.get("batch", 0) is None:
        del data["batch"]
    return json.dumps(data)


def read_records(path: Path) -> list[Record | RepeatRecord]:
    """Records of one jsonl file; a torn last line (a run killed mid-write) is skipped."""
    if not path.is_file():
        return []
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON") from None
        if data.get("kind") not in _KINDS:
            raise ValueError(f"unknown result record kind {data.get('kind')!r}")
        records.append(_KINDS[data["kind"]](**data))
    return records


def read_run(folder: Path) -> list[Record]:
    """Every record of a run folder: the merged file and any per-rank files."""
    records = read_records(folder / RESULTS)
    for path in sorted(folder.glob(RANK_GLOB)):
        records += read_records(path)
    return records


def read_repeats(folder: Path) -> list[RepeatRecord]:
    """The plain-decoding repeats of a run folder (every rank's), by rank and repeat."""
    records = [r for path in sorted(folder.glob(REPEATS_GLOB)) for r in read_records(path)]
    return sorted((r for r in records if isinstance(r, RepeatRecord)), key=lambda r: (r.rank, r.repeat))


def repeats_path(folder: Path, rank: int, world_size: int) -> Path:
    """Where a rank appends its plain-decoding repeats."""
    return folder / ("repeats.jsonl" if world_size == 1 else f"repeats.rank{rank}.jsonl")


@dataclass
class ResultWriter:
    """Appends records to a jsonl file, one flushed line each."""

    path: Path
    _handle: Any = field(default=None, repr=False)

    def write(self, record: Record | RepeatRecord) -> None:
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_file() and self.path.stat().st_size > 0:  # a torn last line (a run killed mid-write) is cut
                with self.path.open("rb+") as handle:  # so that appends start on a fresh line
                    data = handle.read()
                    if not data.endswith(b"\n"):
                        handle.truncate(data.rfind(b"\n") + 1)
            self._handle = self.path.open("a", encoding="utf-8")
        self._handle.write(record_json(record) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def results_path(folder: Path, rank: int, world_size: int) -> Path:
    """Where a rank appends: ``results.jsonl`` alone, ``results.rank<r>.jsonl`` under torchrun."""
    return folder / (RESULTS if world_size == 1 else f"results.rank{rank}.jsonl")


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it into place."""
    write_text_atomically(path, text)


def consolidate(folder: Path, order: list[str]) -> list[Record]:
    """Merge every record of the folder into ``results.jsonl`` (by prompt index, turn, then drafter order)."""
    rank = {label: i for i, label in enumerate(order)}
    records, seen = [], set()
    for record in read_run(folder):
        if isinstance(record, PromptRecord):
            if record.key in seen:
                continue
            seen.add(record.key)
        records.append(record)

    def sort_key(r: Record) -> tuple[int, int, int]:
        return (-1 if r.index is None else r.index, getattr(r, "turn", 0), rank.get(r.drafter, len(rank)))

    records.sort(key=sort_key)
    write_atomic(folder / RESULTS, "".join(record_json(r) + "\n" for r in records))
    for path in folder.glob(RANK_GLOB):
        path.unlink()
    return records


@dataclass
class NoiseCheck:
    """One of the run's own noise measurements (:mod:`specfamily.eval.noise`) and its verdict."""

    name: str  # plain_repeats | verify_cost
    spread: float | None  # relative range (max - min) / median of the repeated timings; None: not measured
    threshold: float  # spread above which the timings are flagged unstable
    samples: int
    unstable: bool
    detail: str  # what was timed and what it showed, in words


@dataclass
class RunInfo:
    """``run.json``: what a run was (config, environment) and what it measured about the target."""

    config: dict[str, Any]
    seed: int
    dataset: str
    sampling: str
    drafters: list[str]
    prompts: int  # records each arm makes: one per prompt, or per turn of a multi-turn prompt
    max_new_tokens: int
    world_size: int
    device: str
    threads: int
    versions: dict[str, str | None]
    git: dict[str, Any] | None
    verify_cost: dict[str, float]  # draft tokens g -> t(g + 1) / t(1) of the target; {} if not measured
    started: str
    plugins: list[dict[str, str | None]] = field(default_factory=list)  # entry points of group "specfamily"
    weights: dict[str, Any] | None = None  # the target's weights hash (environment.weights_hash)
    dataset_fingerprint: str | None = None  # sha256 of the selected prompts (ids, token ids, turns, categories)
    hardware: dict[str, Any] = field(default_factory=dict)  # cpu / gpu model, CUDA, cores, threads, load
    pass_seconds: list[dict[str, float]] = field(default_factory=list)  # per verify-cost round: g -> median s
    noise: list[NoiseCheck] = field(default_factory=list)  # the run's noise checks, written when it finishes
    matmul: str = "exact"  # how the target's lean forward multiplied (specfamily.runtime.matmul): exact, skinny, stream
    matmul_seconds: dict[str, float] = field(default_factory=dict)  # auto's median timed round per kind; {} if not
    dataset_source: dict[str, Any] | None = None  # path, split, revision, fingerprint, rows hash (DatasetSource)

    @property
    def unstable(self) -> bool:
        return any(check.unstable for check in self.noise)

    def save(self, folder: Path) -> None:
        write_atomic(folder / RUN_INFO, json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, folder: Path) -> RunInfo:
        data = json.loads((folder / RUN_INFO).read_text(encoding="utf-8"))
        data["noise"] = [NoiseCheck(**check) for check in data.get("noise", [])]
        return cls(**data)
