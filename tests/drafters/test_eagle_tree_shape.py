"""The EAGLE tree's default size follows the device's verify-cost curve (drafters/eagle/tree_shape.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import specfamily as sf
from specfamily.drafters.eagle import drafter as eagle_drafter
from specfamily.drafters.eagle.tree_shape import TREE_COST_CAP, TREE_SHAPES, default_tree_shape, tree_shape_for
from specfamily.testing import tiny_target


@pytest.mark.parametrize("curve, expected", [
    ({0: 1.0, 32: 1.05}, TREE_SHAPES[-1]),  # an H200's flat curve (docs/gpu-h200.md): EAGLE-2's 60 nodes
    ({0: 1.0, 4: 1.27, 12: 2.1}, TREE_SHAPES[0]),  # this CPU's: nothing fits, the smallest rung
    ({0: 1.0, 24: TREE_COST_CAP, 40: 1.8}, TREE_SHAPES[1]),  # the cap itself still fits
])
def test_the_largest_shape_within_the_cap(curve, expected):
    points = sorted(curve.items())

    def cost(g: float) -> float:
        return next((v for k, v in points if k >= g), points[-1][1])

    assert tree_shape_for(cost) == expected


def test_a_gpu_target_plans_with_its_measured_curve_and_a_cpu_one_times_nothing():
    flat = SimpleNamespace(device=torch.device("cuda"), vocab_size=64, verify_costs={0: 1.0, 32: 1.02})
    assert default_tree_shape(flat) == TREE_SHAPES[-1]
    target = tiny_target("llama", 64, dtype=torch.float32)
    assert default_tree_shape(target) == TREE_SHAPES[0] and target.verify_costs is None


def test_the_drafter_takes_the_devices_shape_unless_told(monkeypatch):
    target = tiny_target("llama", 64, dtype=torch.float32)
    cpu = sf.create_drafter("eagle", target, weights="random")
    assert (cpu.total_tokens, cpu.top_k, cpu.default_gamma) == (12, 4, 5)
    monkeypatch.setattr(eagle_drafter, "default_tree_shape", lambda target: TREE_SHAPES[-1])
    gpu_like = sf.create_drafter("eagle3", target, weights="random")
    assert (gpu_like.total_tokens, gpu_like.top_k, gpu_like.default_gamma) == (60, 10, 7)
    told = sf.create_drafter("eagle", target, weights="random", total_tokens=20, top_k=3)
    assert (told.total_tokens, told.top_k) == (20, 3)
    chain = sf.create_drafter("eagle", target, weights="random", mode="chain")
    assert chain.default_gamma == 4
