"""Options of the self-speculative drafter and the skip-set file the search writes and the drafter reads: a small JSON
record (written atomically) of the model it was searched for (name, type, layer count, config hash, weights digest),
the skipped sub-layers and what the search measured (alpha, c, verify cost, predicted and measured speedup).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specfamily.io.files import write_text_atomically

SKIP_SET_FORMAT = "specfamily.self_spec.skip_set/1"
_CONFIG_KEYS = (
    "model_type", "num_hidden_layers", "hidden_size", "intermediate_size", "n_inner", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size",
)


@dataclass
class SelfSpecConfig:
    """Options of ``self_spec``; ``exit_*`` are the Draft & Verify adaptive draft-exit parameters."""

    skip: Any = None  # a skip-set file, a zoo: name, or a list like ["attn:3", "mlp:4"]; None: the zoo's for the target
    gamma: int | None = None  # draft length (default 4); with adaptive_exit the most tokens one draft may have
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    adaptive_exit: bool = False  # stop drafting when the draft's top-1 probability falls below the threshold
    exit_threshold: float = 0.5  # initial threshold on the draft's top-1 probability
    exit_target: float = 0.9  # acceptance the threshold is steered to (raised below it, lowered above it)
    exit_step: float = 0.01  # epsilon: the threshold's step
    exit_beta1: float = 0.5  # smoothing of the observed acceptance
    exit_beta2: float = 0.9  # smoothing of the threshold

    def __post_init__(self) -> None:
        if not isinstance(self.adaptive_exit, bool):
            raise TypeError(f"adaptive_exit must be a bool, got {self.adaptive_exit!r}")
        for name in ("exit_threshold", "exit_target", "exit_beta1", "exit_beta2"):
            _check_unit(name, getattr(self, name))
        _check_unit("exit_step", self.exit_step)


def _check_unit(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True)
class ModelKey:
    """What a skip set was searched for."""

    name: str
    model_type: str
    num_layers: int
    config_sha256: str
    weights_sha256: str


@dataclass
class SkipSetRecord:
    """One searched skip set and the numbers behind it (c and verify_cost are relative to one target pass)."""

    model: ModelKey
    skip: list[str]
    gamma: int
    alpha: float
    c: float
    verify_cost: float  # t(gamma + 1) / t(1) at this gamma
    predicted_speedup: float
    measured: dict[str, float] | None = None  # tau, alpha, c, speedup of a real run, when validated
    search: dict[str, Any] = field(default_factory=dict)  # how it was searched
    format: str = SKIP_SET_FORMAT


def model_key(model: PreTrainedModel, name: str) -> ModelKey:
    """Fingerprint of a model: a hash of its architecture config and a digest of samples of every weight."""
    config = model.config.get_text_config(decoder=True)
    arch = {key: getattr(config, key, None) for key in _CONFIG_KEYS}
    config_hash = hashlib.sha256(json.dumps(arch, sort_keys=True, default=str).encode()).hexdigest()
    digest = hashlib.sha256()
    for param_name, param in sorted(model.named_parameters()):
        digest.update(param_name.encode())
        digest.update(param.detach().reshape(-1)[:64].to("cpu", torch.float16).numpy().tobytes())
    return ModelKey(name, str(config.model_type), int(config.num_hidden_layers), config_hash, digest.hexdigest())


def save_skip_set(path: str | Path, record: SkipSetRecord) -> Path:
    """Write ``record`` as JSON to ``path`` atomically (a temporary file renamed over it)."""
    path = Path(path)
    text = json.dumps(_json_safe(asdict(record)), indent=2, sort_keys=False) + "\n"
    return write_text_atomically(path, text)


def load_skip_set(path: str | Path) -> SkipSetRecord:
    """Read a skip-set file; a missing file or a malformed record is a ``ValueError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"skip-set file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
        if data.get("format") != SKIP_SET_FORMAT:
            raise ValueError(f"format is {data.get('format')!r}, expected {SKIP_SET_FORMAT!r}")
        model = ModelKey(**data.pop("model"))
        record = SkipSetRecord(model=model, **data)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"{str(path)!r} is not a self_spec skip-set file: {err}") from None
    if not isinstance(record.skip, list) or not all(isinstance(s, str) for s in record.skip):
        raise ValueError(f"{str(path)!r}: 'skip' must be a list of strings like 'attn:3'")
    return record


def shipped_skip_sets() -> dict[str, Path]:
    """The skip sets shipped with the package, by name (``code-target`` -> skip_sets/code-target.json)."""
    folder = resources.files(__package__).joinpath("skip_sets")
    if not isinstance(folder, Path) or not folder.is_dir():
        return {}
    return {path.stem: path for path in sorted(folder.glob("*.json"))}


def check_record_fits(record: SkipSetRecord, key: ModelKey, source: str) -> bool:
    """Refuse a skip set searched for another architecture; False (with no error) when only the weights differ."""
    saved = record.model
    if (saved.model_type, saved.num_layers, saved.config_sha256) != (key.model_type, key.num_layers, key.config_sha256):
        raise ValueError(
            f"skip set {source} was searched for {saved.name!r} ({saved.model_type}, {saved.num_layers} layers, "
            f"config {saved.config_sha256[:12]}), not for this target ({key.model_type}, {key.num_layers} layers, "
            f"config {key.config_sha256[:12]})"
        )
    return saved.weights_sha256 == key.weights_sha256


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
