"""What the benchmark tests share: the scripts of ``benchmarks/`` imported afresh for a test and forgotten after it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def forget_benchmarks() -> None:
    """Drop every module imported from ``benchmarks/`` (a script and the siblings it imports: common, pairs, ...)."""
    names = [name for name, module in list(sys.modules.items())
             if getattr(module, "__file__", None) and Path(module.__file__).resolve().parent == BENCHMARKS]
    for name in names:
        sys.modules.pop(name, None)


@pytest.fixture
def benchmark_module(monkeypatch):
    """``load(name)``: ``benchmarks/<name>.py`` imported afresh, with the ``benchmarks/`` modules it imports (no test
    sees another's patched or half-configured copy); after the test they are forgotten and torch's thread count is
    restored (the scripts fix their own)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = torch.get_num_threads()
    forget_benchmarks()
    yield importlib.import_module
    forget_benchmarks()
    torch.set_num_threads(threads)
