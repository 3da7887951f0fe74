"""The slot buffers: scatter at ragged lengths, per-slot rollback, packing, growth, batch-1 views."""

import torch
from transformers import LlamaConfig

from specfamily.runtime.batch_cache import BatchCache


def _cache(slots=3, capacity=4):
    config = LlamaConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=16, vocab_size=10)
    return BatchCache(config, slots, capacity)


def _write(cache, lo, hi, fed, seed=0):
    """One pass's keys (B, 1, fed, 4) through every layer; returns them."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(hi - lo, 1, fed, 4, generator=gen, dtype=torch.float64)
    with torch.inference_mode():
        cache.plan_pass(lo, hi, fed, torch.device("cpu"))
        for i, layer in enumerate(cache.layers):
            out_k, out_v = layer.update(keys + i, -keys, i)
        cache.end_pass()
    return keys, out_k


def test_a_pass_writes_each_slot_at_its_own_length_and_reads_up_to_the_longest():
    cache = _cache()
    cache.lengths[:] = [2, 0, 1]
    keys, out = _write(cache, 0, 3, fed=3)
    assert out.shape == (3, 1, 2 + 3, 4)
    for slot, length in enumerate([2, 0, 1]):
        assert torch.equal(cache.layers[1].key_buffer[slot, :, length : length + 3], keys[slot] + 1)
        assert torch.equal(cache.layers[0].value_buffer[slot, :, length : length + 3], -keys[slot])
    assert cache.capacity >= 5 and cache.layers[0].key_buffer.shape[2] == cache.capacity  # grew from 4


def test_keep_moves_only_the_accepted_entries_and_move_packs_slots():
    cache = _cache()
    keys, _ = _write(cache, 0, 2, fed=5)
    with torch.inference_mode():
        cache.keep(0, base=1, accepted=[1, 3])  # fed rows 0 (pending), nodes 0..3 at 1..4
        cache.keep(1, base=1, accepted=[0, 1])
        cache.move(1, 2)
    assert cache.lengths == [3, 3, 3]
    assert torch.equal(cache.layers[0].key_buffer[0, :, :3], keys[0, :, [0, 2, 4]])
    assert torch.equal(cache.layers[0].key_buffer[2, :, :3], keys[1, :, :3])
    view = cache.slot_view(0)
    assert torch.equal(view.layers[1].keys, (keys[0:1, :, [0, 2, 4]] + 1))
    assert cache.bytes_per_slot() == 2 * 2 * 1 * cache.capacity * 4 * 8  # layers x (k, v) x heads x cap x D x 8 bytes
