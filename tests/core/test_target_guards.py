"""Target robustness: draft ids outside the vocabulary, per-device commits, the mask-layout cache's key
(generation-config processors: tests/core/test_processors.py)."""

from __future__ import annotations

import pytest
import torch

from specfamily.core import target as target_module
from specfamily.core.target import Target
from specfamily.core.target_cache import gather_tail
from specfamily.core.types import Draft

TREE = [-1, -1, 0, 0, 1, 2]

def _prompt() -> torch.Tensor:
    return torch.tensor([1, 2, 3, 4], dtype=torch.long)

@pytest.mark.parametrize("bad", [50, -1, 10**6])
def test_draft_token_outside_the_vocabulary_is_refused_before_the_model_runs(tiny_model, monkeypatch, bad):
    target = Target(tiny_model("llama"))
    target.forward(_prompt())
    target.commit([])
    monkeypatch.setattr(target, "_model_call", lambda *a, **k: pytest.fail("the model saw the bad draft"))
    with pytest.raises(ValueError, match=rf"draft token id {bad} is outside the target's vocabulary \[0, 50\)"):
        target.forward(torch.tensor([5]), Draft.chain([3, bad, 4]))
    assert target.cached_length == 4 and target._last is None  # nothing happened: the request can go on
    monkeypatch.undo()
    out = target.forward(torch.tensor([5]), Draft.chain([3, 4]))
    assert out.logits.shape == (3, 50)

class _DeviceKeys:
    """Stands in for a cache layer's keys on ``device``: fails, as CUDA does, on an index from another device."""

    def __init__(self, device: str) -> None:
        self.data = torch.arange(6.0).view(1, 1, 6, 1)
        self.device = torch.device(device)
        self.index_devices: list[torch.device] = []

    def numel(self) -> int:
        return self.data.numel()

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if index.device != self.device:
            raise RuntimeError(f"index on {index.device}, keys on {self.device}")
        self.index_devices.append(index.device)
        if index.device.type == "meta":  # no data there: the shape is what matters
            return self.data.index_select(dim, torch.zeros(index.shape, dtype=torch.long))
        return self.data.index_select(dim, index)

    def __setitem__(self, key, value) -> None:
        self.data[key] = value

class _Layer:
    def __init__(self, device: str) -> None:
        self.keys, self.values = _DeviceKeys(device), _DeviceKeys(device)

def test_tree_commit_indexes_each_layer_on_its_own_device():
    """A cache spread over devices (device_map="auto"): every layer gets the index on its keys' device."""

    class Cache:
        layers = [_Layer("cpu"), _Layer("meta"), _Layer("meta")]

    cache = Cache()
    gather_tail(cache, 2, torch.tensor([3, 5]))
    for layer in cache.layers:
        assert layer.keys.index_devices == [layer.keys.device] and layer.values.index_devices == [layer.keys.device]
    assert cache.layers[0].keys.data.view(-1).tolist() == [0, 1, 3, 5, 4, 5]
    # the same on a real CPU/GPU split: tests/gpu/test_cuda_target.py (benchmarks/gpu_check.sh runs it)

def test_mask_layouts_are_kept_per_device_and_dtype(tiny_model):
    """The same tree shape after the model is cast gets a mask in the new dtype (a stale float64 mask would be
    refused by, or silently upcast, the float32 attention)."""
    model = tiny_model("llama").double()
    target = Target(model, fast=False)
    tokens = [5, 6, 7, 8, 9, 10]
    first = target.forward(_prompt(), Draft(tokens, TREE)).logits
    target.commit([])
    model.float()
    target.reset()
    second = target.forward(_prompt(), Draft(tokens, TREE)).logits
    assert second.dtype == torch.float32
    torch.testing.assert_close(second.double(), first, atol=1e-5, rtol=1e-5)
    keys = list(target._layouts)
    assert {key[-1] for key in keys} == {torch.float64, torch.float32}
    assert all(key[-2] == torch.device("cpu") for key in keys)

def test_commit_rewrites_only_the_entries_that_move(tiny_model, monkeypatch):
    """A tree path whose first node is already in place: the rewrite copies the later nodes only, and the cache
    holds the source entries in their new slots, everything before them untouched."""

    target = Target(tiny_model("llama"))
    target.forward(torch.arange(6))
    target.commit([])
    moves = []
    real = target_module.keep_path

    def recorded(cache, base, src, length):
        if src:
            moves.append((base, list(src)))
        real(cache, base, src, length)

    monkeypatch.setattr(target_module, "keep_path", recorded)
    target.forward(torch.tensor([7]), Draft(torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([-1, -1, 0, 0, 1, 2])))
    before = [(layer.keys.clone(), layer.values.clone()) for layer in target.cache.layers]
    target.commit([0, 2, 5])
    base = 7  # 6 cached + the root
    assert moves == [(base + 1, [base + 2, base + 5])]
    for layer, (keys, values) in zip(target.cache.layers, before, strict=True):
        source = list(range(base + 1)) + [base + 2, base + 5]
        assert torch.equal(layer.keys, keys[:, :, source]) and torch.equal(layer.values, values[:, :, source])
    target.forward(torch.tensor([5]), Draft.chain(torch.tensor([1, 2])))
    target.commit([0, 1])  # a chain's path is in place: nothing moves
    assert len(moves) == 1 and target.cached_length == base + 3 + 3
