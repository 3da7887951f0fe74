"""EAGLE-3 checkpoints: the EAGLE/SpecForge and speculators layouts, read and written, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import specfamily as sf
from specfamily.drafters.eagle.drafter import Eagle3Drafter
from specfamily.drafters.eagle.formats3 import load_eagle3, save_eagle3
from specfamily.testing import tiny_target

PRUNED = [0, 2, 3, 5, 6]


def probe(model, target) -> torch.Tensor:
    """Draft-vocabulary distributions over target ids (V,) of a fixed fused input, two steps deep."""
    torch.manual_seed(0)
    features = torch.randn(1, 4, model.fc.in_features, dtype=target.dtype)
    tokens, positions = torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None]
    with torch.inference_mode():
        hidden = model(tokens, model.fuse(features), positions)
        again = model(tokens, hidden, positions + 1)
        return model.full_q(torch.softmax(model.logits(torch.cat([hidden, again])), dim=-1))


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", layers=4)


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
@pytest.mark.parametrize("vocab", [None, PRUNED], ids=["full", "pruned"])
def test_round_trip_gives_the_same_distributions(tmp_path, target, layout, vocab):
    drafter = Eagle3Drafter(target, weights="random", draft_vocab=vocab, layers=[1, 2, 4], seed=3)
    folder = save_eagle3(drafter.model, tmp_path / "ckpt", target, layout=layout)
    config = json.loads((folder / "config.json").read_text())
    names = set(load_file(str(folder / "model.safetensors")))
    prefix = "layers.0." if layout == "speculators" else "midlayer."
    assert f"{prefix}hidden_norm.weight" in names and "fc.weight" in names and "lm_head.weight" in names
    assert ("d2t" in names) == (vocab is not None)
    if layout == "speculators":
        assert config["speculators_model_type"] == "eagle3" and config["speculators_config"]["algorithm"] == "eagle3"
        assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == (len(vocab) if vocab else target.vocab_size)
    loaded = sf.create_drafter("eagle3", target, weights=str(folder), gamma=3)
    assert loaded.needs_features == (1, 2, 4)
    torch.testing.assert_close(probe(loaded.model, target), probe(drafter.model, target), rtol=0, atol=0)


def test_an_unsorted_d2t_and_a_pickled_checkpoint_load_as_the_same_drafter(tmp_path, target):
    drafter = Eagle3Drafter(target, weights="random", draft_vocab=PRUNED, seed=5)
    folder = save_eagle3(drafter.model, tmp_path / "ckpt", target)
    tensors = load_file(str(folder / "model.safetensors"))
    order = torch.tensor([3, 0, 4, 1, 2])  # the reference's draft indices need not follow target ids
    ids = torch.arange(5) + tensors["d2t"]
    tensors["d2t"] = ids[order] - torch.arange(5)
    tensors["lm_head.weight"] = tensors["lm_head.weight"][order]
    (folder / "model.safetensors").unlink()
    torch.save(tensors, folder / "pytorch_model.bin")
    loaded = load_eagle3(folder, target)
    torch.testing.assert_close(probe(loaded, target), probe(drafter.model, target), rtol=0, atol=0)


def test_the_reference_forward_on_the_saved_tensors_gives_our_distribution(tmp_path, target):
    """EAGLE-3's forward written from the reference's description, on the file's tensors alone."""
    drafter = Eagle3Drafter(target, weights="random", draft_vocab=PRUNED, seed=7)
    folder = save_eagle3(drafter.model, tmp_path / "ckpt", target)
    w, config = load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())
    eps, heads, kv = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"]

    def norm(x, name):
        return w[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    torch.manual_seed(0)
    features = torch.randn(4, drafter.model.fc.in_features, dtype=target.dtype)
    tokens = torch.tensor([1, 2, 3, 4])
    hidden = features @ w["fc.weight"].T
    x = torch.cat([norm(target.model.get_input_embeddings().weight[tokens], "midlayer.input_layernorm.weight"),
                   norm(hidden, "midlayer.hidden_norm.weight")], dim=-1)
    q, k, v = (x @ w[f"midlayer.self_attn.{p}_proj.weight"].T for p in "qkv")
    d = q.shape[-1] // heads
    inv = 1.0 / (config["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.arange(4, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rope(t):
        t = t.view(4, -1, d).transpose(0, 1)
        return t * cos + torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1) * sin

    q, k, v = rope(q), rope(k).repeat_interleave(heads // kv, 0), v.view(4, kv, d).transpose(0, 1)
    attn = torch.softmax((q @ k.transpose(1, 2)) / d**0.5 + torch.full((4, 4), -torch.inf).triu(1), -1)
    out = (attn @ v.repeat_interleave(heads // kv, 0)).transpose(0, 1).reshape(4, -1)
    h = hidden + out @ w["midlayer.self_attn.o_proj.weight"].T
    y = norm(h, "midlayer.post_attention_layernorm.weight")
    gate, up = y @ w["midlayer.mlp.gate_proj.weight"].T, y @ w["midlayer.mlp.up_proj.weight"].T
    mlp = torch.nn.functional.silu(gate) * up
    h = h + mlp @ w["midlayer.mlp.down_proj.weight"].T
    logits = norm(h, "norm.weight") @ w["lm_head.weight"].T
    full = torch.zeros(4, target.vocab_size, dtype=target.dtype)
    full[:, torch.arange(len(PRUNED)) + w["d2t"]] = torch.softmax(logits, -1)  # target_id = draft_id + d2t
    torch.testing.assert_close(probe(drafter.model, target)[0], full)


def refusal(tmp_path, target, edit) -> str:
    folder = save_eagle3(Eagle3Drafter(target, weights="random").model, tmp_path / "ckpt", target)
    config = json.loads((folder / "config.json").read_text())
    config.pop("specfamily")
    tensors = load_file(str(folder / "model.safetensors"))
    edit(config, tensors)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        load_eagle3(folder, target)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_checkpoints_that_do_not_fit_are_refused_naming_both_sides(tmp_path, target):
    def hidden(config, tensors):
        config["hidden_size"] = 64

    assert "hidden size 64 does not fit the target's 32" in refusal(tmp_path, target, hidden)

    def vocabulary(config, tensors):
        config["vocab_size"] = 16

    assert "vocabulary 16 does not fit the target's 8" in refusal(tmp_path / "b", target, vocabulary)

    def layers(config, tensors):
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 16, 29]

    assert ("feature layers [2, 16, 29] (EAGLE/SpecForge ids, each a decoder layer's output: hidden_states "
            "[3, 17, 30]) do not fit a target of 4 layers (hidden_states in [0, 4], ids in [-1, 3])"
            in refusal(tmp_path / "c", target, layers))

    def fc(config, tensors):
        tensors["fc.weight"] = tensors["fc.weight"][:, :64].contiguous()

    assert "fc.weight has shape (32, 64); this target needs (32, 96)" in refusal(tmp_path / "d", target, fc)


def test_weights_for_another_target_are_refused(tmp_path, target):
    folder = save_eagle3(Eagle3Drafter(target, weights="random").model, tmp_path / "ckpt", target)
    with pytest.raises(ValueError, match="trained for another target"):
        load_eagle3(folder, tiny_target("llama", layers=4, seed=1))


def test_a_failed_save_leaves_nothing_behind(tmp_path, target):
    model = Eagle3Drafter(target, weights="random").model
    with pytest.raises(ValueError, match="layout"):
        save_eagle3(model, tmp_path / "ckpt", target, layout="onnx")
    assert not (tmp_path / "ckpt").exists()
