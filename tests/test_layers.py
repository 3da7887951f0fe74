"""The layer contract (pyproject.toml [tool.importlinter], docs/architecture.md) holds: imports run only downwards,
no drafter family imports another, and no package's modules import each other in a circle."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept():
    command = shutil.which("lint-imports")
    if command is None:
        pytest.skip("import-linter is not installed (pip install '.[test]')")
    done = subprocess.run([command, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in done.stdout
