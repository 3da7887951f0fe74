"""The drafter registry: names -> factories and option schemas, filled by plugins."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specfamily.core.drafter import Drafter

DrafterFactory = Callable[..., "Drafter"]


@dataclass(frozen=True)
class DrafterEntry:
    """One registered drafter family: ``factory(target, **options) -> Drafter`` and its option schema."""

    name: str
    factory: DrafterFactory
    config: type | None = None
    description: str = ""

    def option_names(self) -> tuple[str, ...]:
        """The option keys the schema accepts, in declaration order (empty when there is no schema)."""
        if self.config is None:
            return ()
        return tuple(f.name for f in dataclasses.fields(self.config) if f.init)


@dataclass(frozen=True)
class DrafterInfo:
    """A row for docs and ``--help``: name, description and options as ``key=default`` (``key`` if required)."""

    name: str
    description: str
    options: tuple[str, ...]


@dataclass
class DrafterRegistry:
    """Drafter families by name. Plugins call :meth:`register`; users call :meth:`create`."""

    entries: dict[str, DrafterEntry] = field(default_factory=dict)

    def register(self, name: str, factory: DrafterFactory, config: type | None = None, description: str = "") -> None:
        """Add a drafter family; a name that is already taken is a ``ValueError``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"drafter name must be a non-empty string, got {name!r}")
        if name in self.entries:
            raise ValueError(f"drafter {name!r} is already registered")
        if not callable(factory):
            raise TypeError(f"factory for drafter {name!r} must be callable, got {factory!r}")
        if config is not None and not (isinstance(config, type) and dataclasses.is_dataclass(config)):
            raise TypeError(f"config for drafter {name!r} must be a dataclass type, got {config!r}")
        self.entries[name] = DrafterEntry(name, factory, config, description)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def entry(self, name: str) -> DrafterEntry:
        """The entry for ``name``; an unknown name is a ``ValueError`` that suggests the nearest names."""
        try:
            return self.entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise ValueError(_unknown_drafter_message(name, self.names())) from None

    def config_class(self, name: str) -> type | None:
        """The option-schema dataclass registered for ``name`` (None when it has none)."""
        return self.entry(name).config

    def validate(self, name: str, /, **options: Any) -> Any:
        """Check ``options`` against the schema of ``name``; return the built config (None without a schema).

        An unknown key is a ``TypeError`` naming it and the valid ones; the schema's own checks
        (``__post_init__``) raise ``ValueError``.
        """
        entry = self.entry(name)
        if entry.config is None:
            return None
        _check_option_keys(entry, options)
        return entry.config(**options)

    def create(self, name: str, target: Any, /, **options: Any) -> Drafter:
        """Validate ``options`` and build the drafter: ``factory(target, **options)`` with the options as given."""
        self.validate(name, **options)
        return self.entry(name).factory(target, **options)

    def describe(self) -> list[DrafterInfo]:
        """One row per drafter, sorted by name."""
        return [_describe_entry(self.entries[name]) for name in self.names()]


def _close(word: object, candidates: list[str]) -> list[str]:
    """The nearest candidates to ``word`` (difflib), best first."""
    return difflib.get_close_matches(word, candidates, n=3) if isinstance(word, str) else []


def _did_you_mean(word: object, candidates: list[str]) -> str:
    """``"did you mean 'x'?"`` (or ``'x' or 'y'``) for the nearest candidates; empty when none is close."""
    close = _close(word, candidates)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _unknown_drafter_message(name: object, known: list[str]) -> str:
    hint = _did_you_mean(name, known)
    hint = f" {hint}" if hint else ""
    return f"unknown drafter {name!r};{hint} known: {', '.join(known) or '(none)'}"


def _unknown_options_message(entry: DrafterEntry, unknown: list[str], valid: list[str]) -> str:
    valid_text = f"valid options: {', '.join(valid) or '(none)'}"
    if len(unknown) == 1:
        hint = _did_you_mean(unknown[0], valid)
        hint = f" {hint}" if hint else ""
        return f"drafter {entry.name!r} got unknown option {unknown[0]!r};{hint} {valid_text}"
    parts = []
    for key in unknown:
        hint = _did_you_mean(key, valid)
        parts.append(f"{key!r} ({hint})" if hint else repr(key))
    return f"drafter {entry.name!r} got unknown options {', '.join(parts)}; {valid_text}"


def _check_option_keys(entry: DrafterEntry, options: dict[str, Any]) -> None:
    """Raise ``TypeError`` for option keys the schema does not declare."""
    valid = list(entry.option_names())
    unknown = [key for key in options if key not in valid]
    if unknown:
        raise TypeError(_unknown_options_message(entry, unknown, valid))


def _format_option(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"{f.name}={f.default!r}"
    if f.default_factory is not dataclasses.MISSING:
        return f"{f.name}={f.default_factory()!r}"
    return f.name


def _describe_entry(entry: DrafterEntry) -> DrafterInfo:
    fields = dataclasses.fields(entry.config) if entry.config is not None else ()
    options = tuple(_format_option(f) for f in fields if f.init)
    return DrafterInfo(entry.name, entry.description, options)
