"""specfamily.testing.cuda_syncs: torch.cuda's sync debug mode read per aten op (CudaSyncOps) and raw
(debug_mode_syncs), with the debug mode's one-time notice told apart, on this CPU with torch.cuda's switches stubbed
and the debug mode's warnings raised by hand; tests/gpu checks them against the real debug mode."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from specfamily.testing.cuda_syncs import CudaSyncOps, debug_mode_syncs, is_sync_warning


@torch.library.custom_op("specfamily_syncs_test::flagged", mutates_args=())
def _flagged(x: torch.Tensor) -> torch.Tensor:
    """An op that warns as torch.cuda's debug mode does inside a synchronising call (CudaSyncOps' input on a GPU)."""
    warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
    return x.clone()


def test_cuda_sync_ops_names_the_op_and_the_line_of_each_flagged_call(monkeypatch):
    """CudaSyncOps' bookkeeping, with torch.cuda's switches stubbed and the debug mode's warning raised by an op
    (inside aten) and by plain code (outside); other warnings go on to the caller's filters. tests/gpu checks it
    against the real debug mode."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    x = torch.arange(3.0)
    with warnings.catch_warnings(record=True) as passed_on:
        warnings.simplefilter("always")
        with CudaSyncOps() as by_op:
            _flagged(x)
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
            warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
            torch.ones(2) + 1
    line = inspect.currentframe().f_lineno - 4  # the line of _flagged(x)
    assert [(s.op, s.where) for s in by_op.syncs] == [
        ("specfamily_syncs_test.flagged.default", f"{__file__}:{line}"), ("(outside aten)", f"{__file__}:{line + 1}")]
    assert by_op.count == 2 and [str(w.message) for w in passed_on] == ["an unrelated warning"]


# The notice torch.cuda.set_sync_debug_mode warns on its first call in a process (torch/csrc/cuda/Module.cpp,
# TORCH_WARN_ONCE), as c10 hands it to Python; the flagged calls' own warning is c10/cuda's warn_or_error_on_sync
NOTICE = ("Synchronization debug mode is a prototype feature and does not yet detect all synchronizing operations "
          "(Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:897.)")
FLAGGED = "called a synchronizing CUDA operation (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:160.)"


@pytest.fixture
def fresh_process(monkeypatch):
    """torch.cuda's switches as in a fresh CUDA process: synchronize does nothing here, and the first
    set_sync_debug_mode (whatever the mode) warns the notice, the later ones nothing."""
    calls = []

    def set_sync_debug_mode(mode):
        if not calls:
            warnings.warn(NOTICE, UserWarning, stacklevel=2)
        calls.append(mode)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_sync_debug_mode)
    return calls


def _flag():
    warnings.warn(FLAGGED, UserWarning, stacklevel=1)  # one flagged call, at this line


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature")
def test_the_debug_modes_one_time_notice_is_no_synchronisation(fresh_process):
    """Session 15's H200 counted 2 synchronisations in a pass that makes 1 when the count was the first in its
    process: a filter on "synchronizing" took the notice ("... does not yet detect all synchronizing operations")
    for a flagged call. CudaSyncOps leaves it out, and keeps it apart (notices) for gpu_check.sh's log."""
    with CudaSyncOps() as first:
        _flag()
    with CudaSyncOps() as second:
        _flag()
    assert (first.count, second.count) == (1, 1), (first, second)
    assert first.notices == [NOTICE] and second.notices == [] and fresh_process == ["warn", "default"] * 2


def test_the_raw_debug_mode_count_leaves_the_notice_out(fresh_process):
    """debug_mode_syncs (tests/gpu's count, no dispatch mode): the first count of a process as the later ones."""
    line = inspect.getsourcelines(_flag)[1] + 1
    assert [debug_mode_syncs(_flag) for _ in range(2)] == [(None, [f"{__file__}:{line}"])] * 2


def test_the_debug_modes_own_warning_tells_a_flagged_call_from_the_notice():
    assert is_sync_warning(FLAGGED) and is_sync_warning("called a synchronizing CUDA operation")
    assert not is_sync_warning(NOTICE) and not is_sync_warning("an unrelated warning")
