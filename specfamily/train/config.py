"""Trainers are configured like runs: ``configs/train/<name>.yaml`` (Hydra), overridden with ``key=value``, checked
against the trainer's config dataclass (field types, then ``__post_init__``). The ``--flag value`` form stays as an
alias: :func:`add_flags` makes one flag per field plus the old names of renamed keys (``--max-minutes``), and
:func:`from_args` maps them onto the same keys. One command line uses one form or the other.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from specfamily.io.configs import configs_dir

T = TypeVar("T")
OVERRIDES = "overrides"  # the argparse destination of the key=value arguments
_TYPES = {"int": int, "float": float, "str": str}


def train_configs() -> Path:
    """The folder of the trainers' configs (``configs/train``)."""
    return configs_dir() / "train"


def compose_config(schema: type[T], name: str, overrides: Sequence[str] = (),
                   values: Mapping[str, Any] | None = None) -> T:
    """``train/<name>.yaml`` with Hydra ``overrides`` (``steps=100``) applied, then ``values`` (plain values, e.g.
    from the old flags), as a checked ``schema`` instance. Unknown keys and values of the wrong type are errors."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(train_configs()), version_base=None, job_name=name):
        composed = compose(config_name=name, overrides=list(overrides))
    merged = OmegaConf.merge(OmegaConf.structured(schema), composed, dict(values or {}))
    try:
        return OmegaConf.to_object(merged)
    except MissingMandatoryValue as err:
        raise ValueError(f"{err.full_key}: missing; give {err.full_key}=... (train/{name}.yaml has no value)") from None


def add_flags(parser: argparse.ArgumentParser, schema: type, renamed: Mapping[str, str] | None = None,
              checked: Mapping[str, Callable[[str], Any]] | None = None) -> None:
    """The old command line on ``parser``: ``--field-name`` per field of ``schema`` (a switch pair ``--x/--no-x``
    for a bool; ``checked`` gives a field its argparse type), ``renamed`` old flags (``{"max-minutes": "minutes"}``)
    and the positional ``key=value`` overrides. A flag not given stays out of the parsed namespace."""
    renamed, checked = renamed or {}, checked or {}
    for f in dataclasses.fields(schema):
        names = ["--" + f.name.replace("_", "-"), *(f"--{old}" for old, new in renamed.items() if new == f.name)]
        default = "(required)" if f.default is dataclasses.MISSING else repr(f.default)
        options: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": f"default: {default}"}
        if str(f.type) in ("bool", "<class 'bool'>"):
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        else:
            kind = checked.get(f.name) or _TYPES.get(f.type if isinstance(f.type, str) else f.type.__name__, str)
            parser.add_argument(*names, type=kind, **options)
    parser.add_argument(OVERRIDES, nargs="*", metavar="key=value",
                        help=f"config overrides (Hydra's grammar) instead of the flags, e.g. steps=100 minutes=5; "
                             f"the keys and defaults: {train_configs()}")


def from_args(schema: type[T], name: str, args: argparse.Namespace, parser: argparse.ArgumentParser) -> T:
    """The config from a namespace :func:`add_flags` parsed: the overrides, or the flags (the fields without a
    default then required, as they always were)."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    values = {key: value for key, value in vars(args).items() if key in fields}
    overrides = vars(args).get(OVERRIDES) or []
    if values and overrides:
        parser.error("give either key=value overrides or the --flags, not both")
    if values:
        missing = [f"--{key.replace('_', '-')}" for key, f in fields.items()
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   and key not in values]
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)}")
    return compose_config(schema, name, overrides, values)
