"""The stream kernel's memory for packed weights (``csrc/stream_slab.cpp``): small packed copies carved one after the
other out of a shared slab, large ones on a 2 MB boundary of their own, every copy on a cache line, and the memory
marked for huge pages (``madvise(MADV_HUGEPAGE)``: the ``hg`` flag of its mapping) where Linux offers them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from mappings import mapping_flags

HUGE = 2 << 20
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _packed(module, out_features: int, in_features: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh weight and its packed copy (made by one product)."""
    weight = torch.randn(out_features, in_features)
    module.linear(torch.randn(1, in_features), weight, None)
    return weight, getattr(weight, module.PACKED_ATTR)[1]


def test_small_packed_copies_are_carved_one_after_the_other(module):
    copies = [_packed(module, 160)[1] for _ in range(3)]  # 10 panels of 64 inputs: 40 KB each
    starts = [c.data_ptr() for c in copies]
    assert all(start % 64 == 0 for start in starts)
    step = copies[0].numel() * 4
    # a new slab may open between two of them, not between both pairs (a slab holds hundreds of these)
    assert starts[1] - starts[0] == step or starts[2] - starts[1] == step


def test_an_inference_weights_passing_copy_is_not_carved_from_the_slabs(module):
    """An inference tensor counts no versions, so its product packs it anew every time (packed_for): that passing
    copy takes ordinary memory, not a place in the slabs, whose bump allocator never reuses a freed place."""

    def passing_product() -> None:
        with torch.inference_mode():
            weight = torch.randn(160, 64)
            module.linear(torch.randn(1, 64), weight, None)
        assert weight.is_inference() and not hasattr(weight, module.PACKED_ATTR)

    kept = []
    for _ in range(3):
        kept.append(_packed(module, 160)[1])
        passing_product()
    starts = [c.data_ptr() for c in kept]
    step = kept[0].numel() * 4
    # the kept copies lie one after the other: nothing was carved between them (a new slab may open once)
    assert starts[1] - starts[0] == step or starts[2] - starts[1] == step


def test_a_large_packed_copy_starts_on_a_huge_page_of_its_own(module):
    _, large = _packed(module, 16 * 4096, 128)  # 32 MB: at least half a slab
    _, small = _packed(module, 160)
    assert large.data_ptr() % HUGE == 0
    assert not large.data_ptr() <= small.data_ptr() < large.data_ptr() + large.numel() * 4


@pytest.mark.skipif(not sys.platform.startswith("linux") or not THP.is_file(), reason="no transparent huge pages")
def test_packed_copies_are_marked_for_huge_pages(module):
    for out_features in (160, 16 * 4096):
        _, packed = _packed(module, out_features, 128)
        assert "hg" in mapping_flags(packed.data_ptr()), out_features


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_large_packed_copy_is_freed_with_its_weight(module):
    """A slab lives as long as a packed copy in it: the large copy's own slab goes with its weight (glibc maps
    allocations this large on their own and unmaps them when freed)."""
    weight, packed = _packed(module, 16 * 4096, 128)
    address = packed.data_ptr()
    assert mapping_flags(address) is not None  # mapped now
    del weight, packed
    assert mapping_flags(address) is None
