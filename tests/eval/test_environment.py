"""What run.json records about the environment: plugins, the weights hash, the prompts' fingerprint, hardware."""

from __future__ import annotations

from importlib import metadata

import torch

from specfamily.eval import environment
from specfamily.eval.datasets import Prompt
from specfamily.eval.environment import hardware, plugin_distributions, prompts_fingerprint, weights_hash


def test_weights_hash_is_stable_and_changes_with_any_weight(tiny_model):
    model = tiny_model("llama")
    first = weights_hash(model)
    assert first == weights_hash(tiny_model("llama"))  # the same weights, built again
    assert first["parameters"] == sum(p.numel() for p in model.parameters()) and first["dtype"] == "float32"
    assert len(first["sha256"]) == 64 and "strided" in first["method"]
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(1.001)  # a "fine-tune" of one matrix
    assert weights_hash(model)["sha256"] != first["sha256"]
    assert weights_hash(tiny_model("llama").to(torch.bfloat16))["sha256"] != first["sha256"]
    assert weights_hash(tiny_model("llama", seed=1))["sha256"] != first["sha256"]


def test_weights_hash_of_a_model_on_the_meta_device_is_none(tiny_model):
    assert weights_hash(tiny_model("gpt2").to("meta")) is None


def test_plugins_are_the_entry_points_of_the_group_with_their_distributions(monkeypatch):
    class Dist:
        name, version = "specfamily-extra", "1.2.3"

    entry = metadata.EntryPoint("mydrafter", "mypkg.drafter", "specfamily")
    monkeypatch.setattr(metadata.EntryPoint, "dist", Dist(), raising=False)
    asked = []

    def entry_points(group):
        asked.append(group)
        return [entry]

    monkeypatch.setattr(environment.metadata, "entry_points", entry_points)
    assert plugin_distributions() == [
        {"name": "mydrafter", "value": "mypkg.drafter", "distribution": "specfamily-extra", "version": "1.2.3"}]
    assert asked == ["specfamily"]


def test_prompts_fingerprint_changes_with_the_token_ids():
    prompts = [Prompt(0, "a", [1, 2, 3], "qa", ("Why?",)), Prompt(1, "b", [4, 5])]
    same = [Prompt(0, "a", [1, 2, 3], "qa", ("Why?",)), Prompt(1, "b", [4, 5])]
    assert prompts_fingerprint(prompts) == prompts_fingerprint(same)
    assert prompts_fingerprint(prompts) != prompts_fingerprint([prompts[0], Prompt(1, "b", [4, 6])])
    assert prompts_fingerprint(prompts) != prompts_fingerprint(prompts[::-1])


def test_hardware_names_the_cpu_threads_and_cuda():
    found = hardware(torch.device("cpu"))
    assert found["torch_threads"] == torch.get_num_threads() and found["cpus"] >= found["usable_cpus"] >= 1
    assert found["cpu"] and found["gpu"] is None and found["cuda"] == torch.version.cuda
    assert found["device"] == "cpu"
