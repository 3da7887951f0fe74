"""Config-time checks of a drafter's option values against the types its schema dataclass declares.

Before any model loads, each option must have its declared type (``confidence: float`` refuses ``abc``, ``gamma: int
| None`` refuses ``4.5``) and ``policy`` must name a draft-length policy; other annotations are left to the drafter.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

PLAIN_TYPES = (bool, int, float, str)
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}


class OptionError(ValueError):
    """A drafter option with a value of the wrong kind; ``key`` names the option."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}")
        self.key = key


def _allowed(hint: Any) -> tuple[type, ...] | None:
    """The plain types a hint allows (NoneType included); None when it allows more than plain types."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = typing.get_args(hint) if union else (hint,)
    if not all(arg is type(None) or arg in PLAIN_TYPES for arg in args):
        return None
    return args


def _fits(value: Any, allowed: tuple[type, ...]) -> bool:
    if value is None:
        return type(None) in allowed
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int):
        return int in allowed or float in allowed
    if isinstance(value, float):
        return float in allowed
    return isinstance(value, str) and str in allowed


def _describe(allowed: tuple[type, ...]) -> str:
    names = [_NAMES[t] for t in allowed if t is not type(None)] + [_NAMES[type(None)]] * (type(None) in allowed)
    return " or ".join(names)


def check_policy(value: Any) -> None:
    """``policy`` must be null or the name of a draft-length policy."""
    from specfamily.core.policy import POLICIES

    if value is not None and (not isinstance(value, str) or value not in POLICIES):
        raise OptionError("policy", f"must be one of {', '.join(sorted(POLICIES))} or null, got {value!r}")


def check_option_values(schema: type, options: Mapping[str, Any]) -> None:
    """Raise :class:`OptionError` for the first option whose value does not have its declared type."""
    try:
        hints = typing.get_type_hints(schema)
    except Exception:  # an annotation naming something its module does not import at run time: nothing is checked
        hints = {}
    for key, value in options.items():
        allowed = _allowed(hints[key]) if key in hints else None
        if allowed is not None and not _fits(value, allowed):
            raise OptionError(key, f"must be {_describe(allowed)}, got {value!r}")
    if "policy" in hints and "policy" in options:
        check_policy(options["policy"])
