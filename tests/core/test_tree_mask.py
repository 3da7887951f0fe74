"""The pass mask kept per layout: views of one buffer that grows with the cache, equal to a freshly built mask."""

from __future__ import annotations

import torch

from specfamily.core.tree_mask import BUFFER_MAX_ROWS, PrefixMask, attention_mask, local_mask, tree_layout

TREE = [-1, -1, 0, 1]


def test_views_equal_a_fresh_mask_at_every_length():
    local = local_mask(1, TREE, torch.float32)
    masks = PrefixMask(local)
    for prefix_len in (0, 1, 5, 63, 64, 65, 200, 97, 0, 301):
        view = masks(prefix_len)
        assert view.shape == (1, 1, 5, prefix_len + 5)
        assert torch.equal(view, attention_mask(prefix_len, local))


def test_the_buffer_is_reused_until_the_cache_outgrows_it():
    masks = tree_layout(1, TREE, torch.float32).mask
    first = masks(10)
    capacity, storage = masks.capacity, first.untyped_storage().data_ptr()
    assert capacity >= 64
    for prefix_len in range(capacity + 1):  # every length it holds: views of the same storage, no new tensor
        assert masks(prefix_len).untyped_storage().data_ptr() == storage
    grown = masks(capacity + 1)  # one past: a wider buffer, by half again
    assert masks.capacity >= (capacity + 1) * 3 // 2 and grown.untyped_storage().data_ptr() != storage
    assert torch.equal(grown, attention_mask(capacity + 1, masks.local))


def test_wide_passes_build_their_mask_per_call():
    local = local_mask(BUFFER_MAX_ROWS + 1, [], torch.float32)
    masks = PrefixMask(local)
    assert torch.equal(masks(7), attention_mask(7, local)) and masks.buffer is None


def test_a_layouts_visibility_is_where_its_mask_is_zero():
    """``TreeLayout.visible``: what ``kernel_visible`` reads back from the pass's mask, contiguous, at every length
    (the buffer's growths included), for pending tokens then a chain or a tree."""
    from specfamily.runtime.attention import kernel_visible

    for m, parents in ((1, [-1, 0, 1, 2]), (1, [-1, -1, 0, 1]), (3, [-1, 0, 0, 1, 2]), (2, [])):
        layout = tree_layout(m, parents, torch.float32)
        q = m + len(parents)
        for start in (0, 1, 17, 64, 200):
            taken, want = kernel_visible(layout.mask(start), q)
            got = layout.visible(start)
            assert taken and got.is_contiguous() and got.dtype == torch.bool
            assert torch.equal(got, want), (m, parents, start)
