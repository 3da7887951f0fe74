"""benchmarks/gpu_syncs.py (gpu_check.sh step 1c) on the CPU: its plumbing, so that a lent GPU's minutes are not
spent on a crash. Every case's stand-in pass counts one synchronisation; the device half runs on CPU tensors with
torch.cuda's debug-mode switches stubbed (nothing to flag there: CudaSyncOps counts 0)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gpu_syncs(benchmark_module, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    return benchmark_module("gpu_syncs")


def test_every_case_runs_and_its_stand_in_pass_synchronises_once(gpu_syncs, capsys):
    assert gpu_syncs.main("cpu") == 0
    lines = capsys.readouterr().out.splitlines()
    passes = [line for line in lines if line.startswith(("verify_tree", "verify_draft"))]
    assert len(passes) == 12 and all(line.endswith("stand-ins 1") for line in passes), lines
    assert lines[-1] == "syncs per pass: at most 1 (cpu and stand-ins)"
