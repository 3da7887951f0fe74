"""From a composed config to what the runner needs: the drafters to compare and the sampling settings.

The ``drafter`` config group holds one file per drafter (``name`` plus the options of its schema
dataclass) and ``all``: every registered drafter, each with its shipped file (or its defaults
when it has none). Options are checked against the registered schema before any model loads,
so a misspelt key is the registry's error, not a silently ignored setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from specfamily.core.types import SamplingConfig

PLAIN = "plain"  # the label of plain decoding (no drafter)
ALL = "all"  # the drafter config that means every registered drafter
SHARED_OPTIONS = ("gamma", "policy")  # what drafter=all may set for every drafter at once
RESUME_KEYS = ("model", "drafter", "dataset", "sampling", "seed")  # must match to resume a run


@dataclass(frozen=True)
class DrafterSpec:
    """One arm of a comparison: plain decoding (``name is None``) or a registered drafter with options."""

    label: str
    name: str | None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def plain(self) -> bool:
        return self.name is None


PLAIN_SPEC = DrafterSpec(PLAIN, None)


def configs_dir() -> Path:
    """The folder of the shipped Hydra configs (package data, so it works from any install)."""
    node = resources.files("specfamily").joinpath("configs")
    if not isinstance(node, Path):
        raise FileNotFoundError("specfamily is not installed as files on disk; its configs cannot be read")
    return node


def _node_options(root: DictConfig, node: DictConfig) -> dict[str, Any]:
    """A drafter node's options, interpolations resolved against the whole config, ``name`` dropped."""
    scratch = root.copy()
    with open_dict(scratch):
        scratch.drafter = node
    options = OmegaConf.to_container(scratch.drafter, resolve=True)
    options.pop("name", None)
    return options


def _shipped_node(name: str) -> DictConfig:
    """``drafter/<name>.yaml`` from the shipped configs, or just ``{name: <name>}`` when there is none."""
    path = configs_dir() / "drafter" / f"{name}.yaml"
    return OmegaConf.load(path) if path.is_file() else OmegaConf.create({"name": name})


def _all_specs(cfg: DictConfig) -> list[DrafterSpec]:
    from specfamily.core.plugins import list_drafters

    node = cfg.drafter
    names = node.get("names")
    names = list_drafters() if names is None else [str(name) for name in names]
    unknown = sorted(set(node.keys()) - {"name", "names", *SHARED_OPTIONS})
    if unknown:
        raise TypeError(
            f"drafter=all got unknown option(s) {unknown}; it takes names and the shared options {list(SHARED_OPTIONS)}"
        )
    shared = {key: node.get(key) for key in SHARED_OPTIONS if node.get(key) is not None}
    specs = []
    for name in names:
        options = {**_node_options(cfg, _shipped_node(name)), **shared}
        specs.append(DrafterSpec(name, name, options))
    return specs


def drafter_specs(cfg: DictConfig) -> list[DrafterSpec]:
    """Plain decoding first, then the drafter(s) the config names, options resolved (not yet validated)."""
    node = cfg.get("drafter")
    if node is None or node.get("name") is None:
        raise ValueError("the config has no drafter.name; choose one with drafter=<name> or drafter=all")
    if node.name == ALL:
        specs = _all_specs(cfg)
    else:
        specs = [DrafterSpec(str(node.name), str(node.name), _node_options(cfg, node))]
    labels = [spec.label for spec in specs]
    if PLAIN in labels or len(set(labels)) != len(labels):
        raise ValueError(f"drafter names must be distinct and not {PLAIN!r}, got {labels}")
    return [PLAIN_SPEC, *specs]


def validate_specs(specs: list[DrafterSpec]) -> None:
    """Check every drafter's options against its registered schema (the registry's own errors)."""
    from specfamily.core.plugins import get_registry

    registry = get_registry()
    for spec in specs:
        if not spec.plain:
            registry.validate(spec.name, **spec.options)


def sampling_config(node: DictConfig | dict) -> SamplingConfig:
    """The SamplingConfig of a ``sampling`` node (its keys are SamplingConfig's fields)."""
    options = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    options.pop("name", None)
    try:
        return SamplingConfig(**options)
    except TypeError as err:
        raise TypeError(f"sampling config: {err}; valid keys: temperature, top_k, top_p") from None


def sampling_label(sampling: SamplingConfig) -> str:
    """A short name: ``greedy`` or e.g. ``t0.7``, ``t1-k5``, ``t0.7-p0.9``."""
    if sampling.greedy:
        return "greedy"
    label = f"t{sampling.temperature:g}"
    if sampling.top_k:
        label += f"-k{sampling.top_k}"
    if sampling.top_p < 1:
        label += f"-p{sampling.top_p:g}"
    return label


def resume_fingerprint(resolved: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that must not change when a run is resumed in the same folder."""
    return {key: resolved.get(key) for key in RESUME_KEYS}
