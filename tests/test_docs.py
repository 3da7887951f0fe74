"""What the README and the engine's docstrings say stays checkable: every shipped experiment is listed, and the
engine's source carries no measured timings (they go stale; measured numbers live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|us|µs)\b")  # "21.09 ms", "313 us"


def _listed(group: str) -> set[str]:
    """The option names README.md's configs/ tree lists for ``group`` (before a colon, comma-separated)."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(rf"^  {group}/ +(.*)$", readme, re.MULTILINE)
    assert line, f"README.md's configs/ tree has no {group}/ line"
    return {name.strip() for name in line.group(1).split(":")[0].split(",")}


def test_the_readme_lists_every_shipped_option():
    for group in ("model", "dataset", "sampling", "experiment"):
        shipped = {path.stem for path in (ROOT / "configs" / group).glob("*.yaml")}
        missing = sorted(shipped - _listed(group))
        assert not missing, f"README.md's configs/ tree does not list {group}/ {missing}"


def test_the_engine_source_carries_no_measured_timings():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "specfamily" / "core").glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if TIMING.search(line)]
    assert not found, "measured timings belong in docs/, not in the source:\n" + "\n".join(found)


def test_the_readme_has_no_stray_text_after_a_table_row():
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| ")]
    assert all(row.rstrip().endswith("|") for row in rows), [row for row in rows if not row.rstrip().endswith("|")]
