"""The KV-cache layer that appends in place (the lean forward: test_lean.py)."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from specfamily.runtime.kv_cache import BufferedLayer, KVArena, shared_arena


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



def _entries(length: int, start: int, heads: int = 2, seed: int = 0):
    generator = torch.Generator().manual_seed(seed + start)
    return torch.randn(1, heads, length, 3, generator=generator), torch.randn(1, heads, length, 3, generator=generator)


@torch.inference_mode()
def test_arena_layers_hold_what_separate_layers_hold_in_one_tensor():
    arena = KVArena()
    shared, alone = [arena.layer() for _ in range(3)], [BufferedLayer() for _ in range(3)]
    for start, length in ((0, 5), (5, 60), (65, 2), (67, 100)):  # the last two grow past the capacity
        for i, (a, b) in enumerate(zip(shared, alone, strict=True)):
            entries = _entries(length, start, seed=10 * i)
            a.update(*entries)
            b.update(*entries)
    assert arena.capacity > 167 and all(layer.in_arena for layer in shared)
    assert shared_arena(shared) is arena
    for a, b in zip(shared, alone, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        a.cut(150)
        b.crop(-17)
        assert torch.equal(a.keys, b.keys) and a.keys.data_ptr() == a._buffers[0].data_ptr()  # a view: no copy
    assert not arena.cut(151)  # longer than the layers hold: nothing done
    before = [(a.keys.clone(), a.values.clone()) for a in shared]
    assert arena.cut(148)  # every layer's views from one narrow and one unbind
    for a, (keys, values) in zip(shared, before, strict=True):
        assert torch.equal(a.keys, keys[:, :, :148]) and torch.equal(a.values, values[:, :, :148])
        assert a.keys is a._own and a.keys.data_ptr() == a._buffers[0].data_ptr()
        assert a.keys.stride() == a._buffers[0].stride() and a.values.data_ptr() == a._buffers[1].data_ptr()
    assert shared_arena(shared) is arena
    for a, (keys, values) in zip(shared, before, strict=True):
        a.update(keys[:, :, 148:].clone(), values[:, :, 148:].clone())  # written in place after the cut
    assert all(a.keys.shape[-2] == 150 and a.keys.data_ptr() == a._buffers[0].data_ptr() for a in shared)
    src = torch.tensor([141, 144, 149])
    want = [(b.keys.index_select(2, src), b.values.index_select(2, src)) for b in alone]
    arena.move(140, src)  # one gather and one copy for every layer
    for a, (keys, values) in zip(shared, want, strict=True):
        assert torch.equal(a.keys[:, :, 140:143], keys) and torch.equal(a.values[:, :, 140:143], values)


@torch.inference_mode()
def test_host_moves_match_the_gather_even_where_sources_follow_their_targets():
    """``move_rows`` (a commit's path on the host) gives what ``move``'s gather gives, for a scattered path and for
    one whose sources sit one slot past their targets (a block copy or a descending loop would read overwritten
    entries there)."""
    for src in ([141, 144, 149], [141, 142, 143, 144], [140, 142]):
        arenas = []
        for _ in range(2):
            arena = KVArena()
            layers = [arena.layer() for _ in range(3)]
            for i, layer in enumerate(layers):
                layer.update(*_entries(150, 0, seed=10 * i))
            arenas.append((arena, layers))
        (gathered, want), (moved, got) = arenas
        gathered.move(140, torch.tensor(src))
        moved.move_rows(140, src)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert torch.equal(got[1].keys[:, :, 140 : 140 + len(src)], _entries(150, 0, seed=10)[0][:, :, src])


@torch.inference_mode()
def test_an_arena_layer_with_a_replaced_tensor_or_another_shape_keeps_its_entries():
    arena = KVArena()
    layers = [arena.layer() for _ in range(2)]
    for layer in layers:
        layer.update(*_entries(4, 0))
    replaced = layers[0]
    replaced.keys, replaced.values = replaced.keys[:, :, 1:].clone(), replaced.values[:, :, 1:].clone()
    assert shared_arena(layers) is None  # not its own view: move would miss it
    keys, _ = replaced.update(*_entries(2, 4))
    assert torch.equal(keys[:, :, :3], _entries(4, 0)[0][:, :, 1:]) and keys.shape[-2] == 5
    assert replaced.in_arena and replaced.keys.data_ptr() == arena.slot(replaced)[0].data_ptr()  # back in its slot
    other = arena.layer()
    other.update(*_entries(3, 0, heads=5))  # five heads: buffers of its own
    assert not other.in_arena and torch.equal(other.keys, _entries(3, 0, heads=5)[0])
    assert shared_arena([*layers, other]) is None


@torch.inference_mode()
def test_an_arena_with_a_layer_never_written_is_not_shared():
    """A pass over fewer layers (transformers' early exit): the layers left out hold nothing, so the arena's one-op
    cut and move would not be right for them; each layer is handled on its own."""
    arena = KVArena()
    written, empty = arena.layer(), arena.layer()
    written.update(*_entries(70, 0))  # past the first capacity: the arena grows, both layers adopt slots
    assert empty.in_arena and empty.keys is None and not empty.owned
    assert shared_arena([written, empty]) is None
    written.cut(5)
    assert torch.equal(written.keys, _entries(70, 0)[0][:, :, :5])


@torch.inference_mode()
def test_an_arenas_expose_makes_each_layers_views_when_they_are_read():
    """``KVArena.expose`` sets no layer: a layer makes its views of the last expose when they are read (a pass's
    sixty views made at once cost ~0.2 ms on a cold cache), and a layer whose keys are then set elsewhere first lets
    every other layer take the views it was owed."""
    arena = KVArena()
    layers = [arena.layer() for _ in range(3)]
    for i, layer in enumerate(layers):
        layer.update(*_entries(40, 0, seed=i))
    full = [(layer.keys.clone(), layer.values.clone()) for layer in layers]
    arena.expose(30)
    assert arena.following and all(layer._seen != arena.epoch for layer in layers)  # nothing made yet
    assert shared_arena(layers) is arena and arena.length == 30
    assert layers[1].keys.shape[-2] == 30 and layers[1]._seen == arena.epoch  # made on reading, that layer only
    assert layers[0]._seen != arena.epoch and layers[2]._seen != arena.epoch
    assert layers[1].keys is layers[1]._own and layers[1].owned
    layers[2].keys = full[2][0][:, :, :10].clone()  # set elsewhere: the others take their views first
    assert not arena.following and layers[0]._seen == arena.epoch
    assert torch.equal(layers[0].keys, full[0][0][:, :, :30]) and torch.equal(layers[0].values, full[0][1][:, :, :30])
    assert layers[0].keys.data_ptr() == arena.slot(layers[0])[0].data_ptr()
    assert shared_arena(layers) is None  # layer 2 holds a tensor of its own now
    assert not arena.cut(20)  # layer 2 holds 10 entries: not following, cut reads every layer's length
    with pytest.raises(ValueError, match=rf"^expose: {arena.capacity + 1} entries do not fit the arena's capacity "
                                         rf"{arena.capacity}$"):
        arena.expose(arena.capacity + 1)
    assert arena.cut(10) and arena.following and shared_arena(layers) is arena  # every layer follows again
    assert all(torch.equal(layer.keys, arena.slot(layer)[0][:, :, :10]) for layer in layers)
