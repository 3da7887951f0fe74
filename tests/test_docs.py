"""What the docs and the engine's docstrings say stays checkable: every shipped experiment is listed (in the configs
reference, docs/running.md, which the README links), and the engine's source carries no measured timings (they go
stale; measured numbers live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS_DOC = ROOT / "docs" / "running.md"  # the configs/ tree, moved there from the README
TABLE_DOCS = ("README.md", "docs/drafters.md", "docs/results.md")  # the README's tables and the ones moved out of it
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|us|µs)\b")  # "21.09 ms", "313 us"


def _listed(group: str) -> set[str]:
    """The option names docs/running.md's configs/ tree lists for ``group`` (before a colon, comma-separated)."""
    text = CONFIGS_DOC.read_text()
    line = re.search(rf"^  {group}/ +(.*)$", text, re.MULTILINE)
    assert line, f"docs/running.md's configs/ tree has no {group}/ line"
    return {name.strip() for name in line.group(1).split(":")[0].split(",")}


def test_the_docs_list_every_shipped_option():
    for group in ("model", "dataset", "sampling", "experiment"):
        shipped = {path.stem for path in (ROOT / "configs" / group).glob("*.yaml")}
        missing = sorted(shipped - _listed(group))
        assert not missing, f"docs/running.md's configs/ tree does not list {group}/ {missing}"


def test_the_engine_source_carries_no_measured_timings():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted((ROOT / "specfamily" / "core").glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if TIMING.search(line)]
    assert not found, "measured timings belong in docs/, not in the source:\n" + "\n".join(found)


def test_the_readme_and_its_moved_tables_have_no_stray_text_after_a_table_row():
    for name in TABLE_DOCS:
        rows = [line for line in (ROOT / name).read_text().splitlines() if line.startswith("| ")]
        stray = [row for row in rows if not row.rstrip().endswith("|")]
        assert not stray, f"{name}: {stray}"


def test_the_readme_links_docs_that_exist():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"\bdocs/[\w.-]+\.md\b", readme))
    assert named, "the README names no page under docs/"
    missing = sorted(name for name in named if not (ROOT / name).is_file())
    assert not missing, f"README.md names docs that do not exist: {missing}"
