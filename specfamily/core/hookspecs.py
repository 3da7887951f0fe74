"""pluggy hook specifications for the project ``specfamily``.

A plugin (a built-in drafter package or a third-party distribution exposing an entry point in the
``specfamily`` group) implements the hooks below, marked with :data:`hookimpl`::

    from specfamily.core.hookspecs import hookimpl

    @hookimpl
    def specfamily_register_drafters(registry):
        registry.register("toy", ToyDrafter, config=ToyConfig, description="a toy drafter")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
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
