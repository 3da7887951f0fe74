"""Target robustness: draft ids outside the vocabulary, generation-config processors, per-device commits, the
mask-layout cache's key."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from specfamily.core import target as target_module
from specfamily.core.processors import active_logits_processors
from specfamily.core.target import Target, load_target
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


def test_generation_config_processors_are_refused_by_name(tiny_model):
    model = tiny_model("llama")
    model.generation_config.repetition_penalty = 1.1
    with pytest.raises(ValueError, match=r"repetition_penalty=1\.1"):
        Target(model)
    with pytest.raises(ValueError, match="repetition_penalty"):
        load_target(model)


@pytest.mark.parametrize(
    "setting",
    [
        {"no_repeat_ngram_size": 3}, {"suppress_tokens": [1, 2]}, {"begin_suppress_tokens": [0]},
        {"bad_words_ids": [[4]]}, {"min_new_tokens": 5}, {"min_length": 10}, {"forced_bos_token_id": 1},
        {"forced_eos_token_id": 2}, {"sequence_bias": {(3,): 1.0}}, {"exponential_decay_length_penalty": (4, 1.5)},
        {"guidance_scale": 1.5},
    ],
)
def test_each_processor_setting_is_named(setting):
    assert active_logits_processors(GenerationConfig(**setting)) == list(setting)


def test_defaults_neutral_values_and_sampling_settings_are_not_refused(tiny_model):
    assert active_logits_processors(GenerationConfig()) == []  # transformers 5.24: every default is None
    neutral = GenerationConfig(repetition_penalty=1.0, no_repeat_ngram_size=0, min_length=0, min_new_tokens=0,
                               suppress_tokens=[], bad_words_ids=None, guidance_scale=1.0)
    assert active_logits_processors(neutral) == []
    model = tiny_model("llama")
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.6, top_k=20, top_p=0.95, min_p=0.05,
                                               typical_p=0.9, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    Target(model)  # sampling defaults are settings, not processors: SamplingConfig is always explicit
    assert active_logits_processors(None) == []


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
    target_module._gather_tail(cache, 2, torch.tensor([3, 5]))
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
