"""``specfamily.runtime.huge_pages.huge_empty``: a tensor of the shape and dtype asked, 2 MB-aligned, on a mapping
marked for huge pages (its ``hg`` flag) where Linux offers them, unmapped with its last tensor; ``torch.empty`` for
less than a huge page and elsewhere."""

from __future__ import annotations

import gc
import sys

import pytest
import torch
from mappings import mapping_flags

from specfamily.runtime.huge_pages import HUGE_PAGE, huge_empty

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def test_the_tensor_is_what_was_asked_and_starts_on_a_huge_page():
    t = huge_empty((2, 3, 1000, 100), torch.float32)  # 2.4 MB
    assert t.shape == (2, 3, 1000, 100) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0
    t.fill_(2.0)
    assert t.sum().item() == 2.0 * t.numel()
    assert huge_empty((0, 4), torch.float16).shape == (0, 4)


@linux
def test_less_than_a_huge_page_is_ordinary_memory(monkeypatch):
    """A 2 MB page for a small buffer would be mostly empty (and zeroed whole on first touch): no mapping of its own.
    (Its flags do not tell: ordinary memory may sit in a heap region another allocation marked, as a full run's
    earlier tests leave it.)"""
    import mmap

    def no_mapping(*args, **kwargs):
        raise AssertionError("a small buffer got a mapping of its own")

    monkeypatch.setattr(mmap, "mmap", no_mapping)
    small = huge_empty((100, 64), torch.float32)
    assert small.shape == (100, 64) and small.is_contiguous()
    monkeypatch.undo()
    big = huge_empty((HUGE_PAGE // 4,), torch.float32)  # one huge page: its own mapping, marked
    assert "hg" in (mapping_flags(big.data_ptr()) or set())


@linux
def test_its_mapping_is_marked_for_huge_pages_and_goes_with_its_last_view():
    t = huge_empty((4 << 20,), torch.float32)
    address = t.data_ptr()
    assert "hg" in mapping_flags(address)
    view = t[10:20]
    del t
    gc.collect()
    assert mapping_flags(address) is not None  # a view keeps it
    del view
    gc.collect()
    assert mapping_flags(address) is None
