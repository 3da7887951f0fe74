"""On CUDA: the target's cache spread over devices (as ``device_map="auto"`` leaves it) commits a tree's accepted
path in every layer on that layer's own device (tests/core/test_target_guards.py checks the indexing with stand-in
keys on CPU and meta)."""

from __future__ import annotations

import pytest
import torch

from specfamily.core.target import Target
from specfamily.core.types import Draft

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

TREE = [-1, -1, 0, 0, 1, 2]


def test_tree_commit_on_a_cache_split_over_cpu_and_gpu(tiny_model):
    model = tiny_model("llama")
    split, whole = Target(model), Target(model)
    for target in (split, whole):
        target.forward(torch.tensor([1, 2, 3, 4]), Draft(list(range(6)), TREE))
    for layer in split.cache.layers[1:]:
        layer.keys, layer.values = layer.keys.cuda(), layer.values.cuda()
    split.commit([1, 4])
    whole.commit([1, 4])
    assert not split.cache.layers[0].keys.is_cuda and split.cache.layers[-1].keys.is_cuda
    assert split.cached_length == whole.cached_length == 4 + 2
    for ours, reference in zip(split.cache.layers, whole.cache.layers, strict=True):
        assert torch.equal(ours.keys.cpu(), reference.keys) and torch.equal(ours.values.cpu(), reference.values)
