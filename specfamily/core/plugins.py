"""The pluggy host: built-in drafter modules plus third-party entry points, built lazily.

Built-ins (:data:`DEFAULT_PLUGINS`) are registered directly; third-party plugins come from the
entry-point group ``specfamily`` unless ``SPECFAMILY_DISABLE_PLUGIN_AUTOLOAD`` is set (non-empty),
which turns off entry-point loading only. Nothing is built at import time.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from specfamily.core import hookspecs
from specfamily.core.registry import DrafterInfo, DrafterRegistry

if TYPE_CHECKING:
    from specfamily.core.drafter import Drafter

ENTRY_POINT_GROUP = "specfamily"
DISABLE_AUTOLOAD_ENV = "SPECFAMILY_DISABLE_PLUGIN_AUTOLOAD"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "specfamily.drafters.small_model",
    "specfamily.drafters.prompt_lookup",
    "specfamily.drafters.self_spec",
    "specfamily.drafters.medusa",
    "specfamily.drafters.eagle",
    "specfamily.drafters.suffix",
    "specfamily.drafters.merge",
    "specfamily.drafters.recycling",
    "specfamily.drafters.rest",
    "specfamily.drafters.lookahead",
)


def _import_if_present(module_name: str) -> ModuleType | None:
    """Import ``module_name``; None when that module itself (or a package above it) does not exist.

    Any other import failure, including a missing dependency of an existing module, propagates.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            return None
        raise


def _autoload_disabled() -> bool:
    return bool(os.environ.get(DISABLE_AUTOLOAD_ENV))


def build_plugin_manager() -> pluggy.PluginManager:
    """A fresh plugin manager: the hookspecs, the built-ins present, then third-party entry points."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for module_name in DEFAULT_PLUGINS:
        module = _import_if_present(module_name)
        if module is not None and not pm.is_registered(module):
            pm.register(module, name=module_name)
    if not _autoload_disabled():
        load_entry_points(pm)
    return pm


def _distribution(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


def load_entry_points(pm: pluggy.PluginManager, group: str = ENTRY_POINT_GROUP) -> list[str]:
    """Register every plugin of the entry-point group; one that fails to import is skipped with a warning that
    names it and its distribution (one broken plugin must not break every run). Returns the names skipped."""
    skipped = []
    for entry_point in importlib.metadata.entry_points(group=group):
        try:  # one entry point at a time, through pluggy, so its distribution is recorded as usual
            pm.load_setuptools_entrypoints(group, name=entry_point.name)
        except Exception as err:  # noqa: BLE001 - any import failure of a third-party plugin is reported, not fatal
            warnings.warn(
                f"specfamily plugin {entry_point.name!r} ({entry_point.value}) from {_distribution(entry_point)} "
                f"failed to import and is skipped: {type(err).__name__}: {err}",
                RuntimeWarning,
                stacklevel=2,
            )
            skipped.append(entry_point.name)
    return skipped


@dataclass
class PluginState:
    """The plugin manager and, once asked for, the registry its plugins filled."""

    manager: pluggy.PluginManager
    _registry: DrafterRegistry | None = field(default=None, repr=False)

    @property
    def registry(self) -> DrafterRegistry:
        """Calls ``specfamily_register_drafters`` over all plugins on first access."""
        if self._registry is None:
            registry = DrafterRegistry()
            self.manager.hook.specfamily_register_drafters(registry=registry)
            self._registry = registry
        return self._registry


@functools.lru_cache(maxsize=1)
def _plugin_state() -> PluginState:
    """The one cached plugin state, built on first use."""
    return PluginState(build_plugin_manager())


def get_plugin_manager() -> pluggy.PluginManager:
    """The plugin manager, built on the first call and cached."""
    return _plugin_state().manager


def get_registry() -> DrafterRegistry:
    """The drafter registry filled by every plugin (cached with the manager)."""
    return _plugin_state().registry


def reset_plugins() -> None:
    """Forget the cached manager and registry; the next use rebuilds them."""
    _plugin_state.cache_clear()


def rebuild_plugin_manager() -> pluggy.PluginManager:
    """Rebuild the plugin manager now (re-reading DEFAULT_PLUGINS, entry points and the environment)."""
    reset_plugins()
    return get_plugin_manager()


def is_built() -> bool:
    """Whether the plugin manager has been built (it is not at import time)."""
    return _plugin_state.cache_info().currsize > 0


def create_drafter(name: str, target: Any, /, **options: Any) -> Drafter:
    """Build the registered drafter ``name`` for ``target``; options are checked against its schema."""
    return get_registry().create(name, target, **options)


def list_drafters() -> list[str]:
    """Names of every registered drafter, sorted."""
    return get_registry().names()


def describe_drafters() -> list[DrafterInfo]:
    """One docs row per registered drafter, sorted by name."""
    return get_registry().describe()


def plugin_config_paths() -> list[str | Path]:
    """Every config folder the plugins ship (``specfamily_config_path``), in the hook's call order, without repeats."""
    paths: list[str | Path] = []
    for result in get_plugin_manager().hook.specfamily_config_path():
        for item in result if isinstance(result, (list, tuple)) else [result]:
            if not isinstance(item, (str, Path)):
                raise TypeError(f"specfamily_config_path must return folders or search-path strings, got {item!r}")
            paths.append(item)
    return list(dict.fromkeys(paths))
