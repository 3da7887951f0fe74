"""From a composed config to what the runner needs: the arms to compare and the sampling settings.

The ``drafter`` group holds one file per drafter (``name`` plus its schema's options) and two that make several
arms: ``all`` (every registered drafter) and ``arms`` (labelled arms, ``drafter.arms={label: {name: <drafter>,
<option>: <value>}}``), found through :mod:`specfamily.eval.searchpath`. :func:`check_config` checks everything a run
reads before any model loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from specfamily.core.types import SamplingConfig
from specfamily.eval.searchpath import configs_dir as configs_dir  # re-exported: where the shipped configs are
from specfamily.eval.searchpath import current_search_path, find_config, load_yaml

PLAIN = "plain"  # the label of plain decoding (no drafter)
ALL = "all"  # the drafter config that means every registered drafter
ARMS = "arms"  # the drafter config of labelled arms
SHARED_OPTIONS = ("gamma", "policy")  # what drafter=all may set for every drafter at once
RESUME_KEYS = ("model", "drafter", "dataset", "sampling", "seed")  # must match to resume a run
RUN_LABEL = "run_label"  # a run's name in a combined report (a sweep job: its own overrides)
LABEL_FORBIDDEN = ("|", "\n", ",")  # would break the report's table or the summary CSV


class ConfigError(ValueError):
    """A problem with the composed config, found before any model loads; the message is one line naming the key."""


@dataclass(frozen=True)
class DrafterSpec:
    """One arm of a comparison: plain decoding (``name is None``) or a registered drafter with options."""

    label: str
    name: str | None
    options: dict[str, Any] = field(default_factory=dict)
    where: str = field(default="drafter", compare=False)  # the config key its options come from (for errors)
    optional: bool = field(default=False, compare=False)  # drafter=all's: left out, not failed, without zoo weights

    @property
    def plain(self) -> bool:
        return self.name is None


PLAIN_SPEC = DrafterSpec(PLAIN, None)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _node_options(root: DictConfig, node: DictConfig, where: str) -> dict[str, Any]:
    """A drafter node's options, interpolations resolved against the whole config, ``name`` dropped."""
    scratch = root.copy()
    with open_dict(scratch):
        scratch.drafter = node
    try:
        options = OmegaConf.to_container(scratch.drafter, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{where}.{err.key}: missing mandatory value (???); set it") from None
    except OmegaConfBaseException as err:
        raise ConfigError(f"{where}.{err.key}: {_first_line(err)}") from None
    options.pop("name", None)
    return options


def drafter_node(name: str, search_path: Sequence[str]) -> DictConfig:
    """``drafter/<name>.yaml`` from the first search-path entry that has it, or just ``{name: <name>}``."""
    path = find_config("drafter", name, search_path)
    if path is None:
        return OmegaConf.create({"name": name})
    node = load_yaml(path)
    if not isinstance(node, DictConfig) or "defaults" in node:
        raise ConfigError(f"{path}: a drafter file read by drafter=all or arms must be a plain mapping of options")
    return node


def _check_keys(node: DictConfig, allowed: set[str], what: str) -> None:
    unknown = sorted(set(node.keys()) - allowed)
    if unknown:
        raise TypeError(f"{what} got unknown option(s) {unknown}; it takes {sorted(allowed - {'name'})}")


def _all_specs(cfg: DictConfig, search_path: Sequence[str]) -> list[DrafterSpec]:
    from specfamily.core.plugins import list_drafters
    from specfamily.eval.options import OptionError, check_policy

    node = cfg.drafter
    _check_keys(node, {"name", "names", *SHARED_OPTIONS}, "drafter=all")
    names = node.get("names")
    names = list_drafters() if names is None else [str(name) for name in names]
    shared = {key: node.get(key) for key in SHARED_OPTIONS if node.get(key) is not None}
    check_policy(shared.get("policy"))  # drafter=all's own gamma and policy, named as drafter.<key> in errors
    gamma = shared.get("gamma")
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, int)):
        raise OptionError("gamma", f"must be an integer or null, got {gamma!r}")
    specs = []
    for name in names:
        where = f"drafter/{name}"
        options = {**_node_options(cfg, drafter_node(name, search_path), where), **shared}
        specs.append(DrafterSpec(name, name, options, where, optional=True))
    return specs


def _arm_specs(cfg: DictConfig, search_path: Sequence[str]) -> list[DrafterSpec]:
    node = cfg.drafter
    _check_keys(node, {"name", "arms"}, "drafter=arms")
    arms = node.get("arms")
    if not isinstance(arms, DictConfig) or not arms:
        raise ConfigError("drafter.arms: give at least one arm, e.g. drafter.arms={chain: {name: medusa, tree: chain}}")
    specs = []
    for label, arm in arms.items():
        where = f"drafter.arms.{label}"
        arm = OmegaConf.create({}) if arm is None else arm
        if not isinstance(arm, DictConfig):
            raise ConfigError(f"{where}: an arm is a mapping of options (with name: <drafter>), got {arm!r}")
        name = arm.get("name")  # else the label up to its first ``:`` (``medusa:chain``)
        name = str(name) if name is not None else str(label).split(":", 1)[0]
        merged = OmegaConf.merge(drafter_node(name, search_path), arm)
        specs.append(DrafterSpec(str(label), name, _node_options(cfg, merged, where), where))
    return specs


def drafter_specs(cfg: DictConfig, search_path: Sequence[str] | None = None) -> list[DrafterSpec]:
    """Plain decoding first, then the arm(s) the config names, options resolved (not yet validated).

    ``search_path``: where ``drafter/<name>.yaml`` files are looked up for ``all`` and ``arms``;
    None: the running app's search path (the default one outside the app).
    """
    node = cfg.get("drafter")
    if node is None or node.get("name") is None:
        raise ValueError("the config has no drafter.name; choose one with drafter=<name>, drafter=all or drafter=arms")
    if node.name in (ALL, ARMS):
        entries = current_search_path(cfg) if search_path is None else list(search_path)
        specs = _all_specs(cfg, entries) if node.name == ALL else _arm_specs(cfg, entries)
    else:
        specs = [DrafterSpec(str(node.name), str(node.name), _node_options(cfg, node, "drafter"))]
    labels = [spec.label for spec in specs]
    bad = [label for label in labels if not label or label == PLAIN or any(c in label for c in LABEL_FORBIDDEN)]
    if bad or len(set(labels)) != len(labels):
        raise ValueError(
            f"arm labels must be distinct, non-empty, not {PLAIN!r} and without {LABEL_FORBIDDEN}, got {labels}"
        )
    return [PLAIN_SPEC, *specs]


def validate_spec(spec: DrafterSpec) -> None:
    """Check one arm's options: value types and policy (:mod:`specfamily.eval.options`), then the registry's checks."""
    from specfamily.core.plugins import get_registry
    from specfamily.eval.options import check_option_values

    if spec.plain:
        return
    registry = get_registry()
    schema = registry.config_class(spec.name)
    if schema is not None:
        check_option_values(schema, spec.options)
    registry.validate(spec.name, **spec.options)


def validate_specs(specs: list[DrafterSpec]) -> None:
    """Check every arm's options against its registered schema (the registry's own errors)."""
    for spec in specs:
        validate_spec(spec)


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
    """The part of a resolved config that must not change when a run is resumed in the same folder (the load
    settings only when they differ from batch 1, so runs from before them resume)."""
    fingerprint = {key: resolved.get(key) for key in RESUME_KEYS}
    if resolved.get("batch_size", 1) not in (None, 1) or resolved.get("arrival_rate") is not None or resolved.get(
            "batched"):
        fingerprint.update({key: resolved.get(key) for key in ("batch_size", "arrival_rate", "batched")})
    return fingerprint


def _checked(where: str, check, *args):
    """``check(*args)``, its TypeError or ValueError made a one-line ConfigError prefixed with ``where``."""
    from specfamily.eval.options import OptionError

    try:
        return check(*args)
    except ConfigError:
        raise
    except OptionError as err:
        raise ConfigError(f"{where}.{_first_line(err)}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {_first_line(err)}") from None


def check_config(cfg: DictConfig, search_path: Sequence[str] | None = None) -> list[DrafterSpec]:
    """Everything a run reads from ``cfg``, checked before any model loads; a problem is a :class:`ConfigError`."""
    from specfamily.eval.batching import BatchSettings
    from specfamily.eval.datasets import DatasetSpec

    try:  # missing mandatory values (???) and interpolations that do not resolve
        missing = sorted(OmegaConf.missing_keys(cfg))
        if not missing:
            OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{err.full_key or 'config'}: {_first_line(err)}") from None
    if missing:
        raise ConfigError(f"{', '.join(missing)}: missing mandatory value (???); set it, e.g. {missing[0]}=...")
    specs = _checked("drafter", drafter_specs, cfg, search_path)
    for spec in specs[1:]:
        _checked(spec.where, validate_spec, spec)
    _checked("sampling", sampling_config, cfg.sampling)
    _checked("dataset", DatasetSpec.from_config, cfg.dataset)
    try:
        BatchSettings.from_config(cfg)
    except ValueError as err:  # its message names the key
        raise ConfigError(str(err)) from None
    return specs
