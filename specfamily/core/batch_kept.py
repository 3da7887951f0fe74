"""A drafter class's records kept on its target across ``generate_batch`` calls (``Target.batch_realized``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["kept_record"]

T = TypeVar("T")


def kept_record(target, drafter, name: str, fresh: Callable[[], T]) -> T:
    """``drafter``'s class's record ``name`` on ``target`` (made by ``fresh`` the first time), kept across calls; a
    target without such records, or no drafter: a fresh one, the run's own."""
    kept = getattr(target, "batch_realized", None)
    if kept is None or drafter is None:
        return fresh()
    key = (name, type(drafter).__qualname__)
    record = kept.get(key)
    if record is None:
        record = kept[key] = fresh()
    return record
