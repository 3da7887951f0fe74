"""The KV-cache layer that appends in place (the lean forward: test_lean.py)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from specfamily.runtime.kv_cache import BufferedLayer


def _update(layer, length: int, start: int = 0):
    keys = torch.arange(start, start + length, dtype=torch.float32).view(1, 1, length, 1).expand(1, 2, length, 3)
    return layer.update(keys.clone(), -keys.clone())


@torch.inference_mode()
def test_buffered_layer_matches_dynamic_layer_and_appends_in_place():
    buffered, dynamic = BufferedLayer(), DynamicLayer()
    for start, length in ((0, 5), (5, 1), (6, 3)):
        a, b = _update(buffered, length, start), _update(dynamic, length, start)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    pointer = buffered.keys.data_ptr()
    _update(buffered, 1, 9)
    assert buffered.keys.data_ptr() == pointer  # written into the spare room, not copied
    buffered.crop(-4)
    dynamic.crop(-3)
    assert torch.equal(buffered.keys, dynamic.keys) and buffered.get_seq_length() == 6
    _update(buffered, 200, 6)  # past the capacity: a larger buffer, the old entries kept
    assert buffered.get_seq_length() == 206 and torch.equal(buffered.keys[:, :, :6], dynamic.keys)


@torch.inference_mode()
def test_buffered_layer_takes_over_a_replaced_tensor():
    layer = BufferedLayer()
    _update(layer, 4)
    layer.keys, layer.values = layer.keys[:, :, 1:].clone(), layer.values[:, :, 1:].clone()  # not a buffer view
    keys, _ = _update(layer, 2, 4)
    assert keys[0, 0, :, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_buffered_layer_concatenates_outside_inference_mode():
    layer = BufferedLayer()
    with torch.no_grad():
        _update(layer, 3)
        keys, _ = _update(layer, 1, 3)
    assert keys[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert not keys.is_inference()

