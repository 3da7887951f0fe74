"""pluggy hook specifications for the project ``specfamily``.

A plugin (a built-in drafter package or a third-party distribution exposing an entry point in the
``specfamily`` group) implements the hooks below, marked with :data:`hookimpl`::

    from specfamily.core.hookspecs import hookimpl

    @hookimpl
    def specfamily_register_drafters(registry):
        registry.register("toy", ToyDrafter, config=ToyConfig, description="a toy drafter")

    @hookimpl
    def specfamily_config_path():
        return "pkg://toy_plugin.configs"  # holds drafter/toy.yaml, so `specfamily drafter=toy` works
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from specfamily.core.registry import DrafterRegistry

PROJECT_NAME = "specfamily"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def specfamily_register_drafters(registry: DrafterRegistry) -> None:
    """Register drafter families by calling ``registry.register(name, factory, config=..., description=...)``.

    Called once per plugin when the registry is first needed. ``factory(target, **options)`` must
    return a Drafter; ``config`` is the dataclass that is the drafter's option schema. A name that
    is already registered (by this or another plugin) is a ``ValueError``.
    """


@hookspec
def specfamily_config_path() -> str | Path | list[str | Path] | None:
    """A Hydra config folder (or several) holding this plugin's config groups, e.g. ``drafter/<name>.yaml``.

    Return a folder path, a Hydra search-path entry (``pkg://package.with.configs`` or
    ``file:///abs/folder``), a list of them, or None. ``specfamily`` puts them on Hydra's search path
    after the user's folders and the shipped configs (a plugin adds names; it does not replace
    shipped files), so ``drafter=<name>`` composes the plugin's file and ``drafter=all`` and
    labelled arms start from it. Called when the ``specfamily`` app starts.
    """
