"""This process's memory mappings as Linux lists them (/proc/self/smaps), for tests of where memory lives."""

from __future__ import annotations

from pathlib import Path


def mapping_flags(address: int) -> set[str] | None:
    """The VmFlags of the mapping of this process that holds ``address`` (``hg``: marked for huge pages), None where
    none does."""
    holds = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(part, 16) for part in head.split("-"))
            holds = start <= address < end
        elif line.startswith("VmFlags:") and holds:
            return set(line.split()[1:])
    return None
