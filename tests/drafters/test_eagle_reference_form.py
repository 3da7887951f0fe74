"""The eagle head's reference form (no input norm on the draft layer, as EAGLE's layer 0): trained here with
``--reference-form``, exported to the EAGLE repository's layout, loaded back with the same distributions and greedy
text; the default form (the shipped heads') unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import specfamily as sf
import specfamily.drafters.eagle.train as eagle_train
from specfamily.drafters.eagle.checkpoint import load_eagle, save_eagle
from specfamily.drafters.eagle.model import build_model
from specfamily.recipes.cli import main as zoo_main
from specfamily.testing import tiny_model, tiny_target


def _train_argv(tmp_path, out: str, steps: int = 8) -> list[str]:
    if not (tmp_path / "target").is_dir():
        tiny_model("llama", 32, dtype=torch.float32, spread=2.0).save_pretrained(tmp_path / "target")
        np.save(tmp_path / "tokens.npy", np.random.default_rng(0).integers(0, 32, 5000).astype(np.uint16))
    return ["--target", str(tmp_path / "target"), "--tokens", str(tmp_path / "tokens.npy"), "--out", out,
            "--steps", str(steps), "--minutes", "0", "--batch", "2", "--seq-len", "16", "--warmup", "2",
            "--eval-every", "4", "--ckpt-every", "4", "--eval-windows", "2", "--tau-prompts", "2",
            "--tau-prompt-len", "8", "--tau-tokens", "8", "--save-dtype", "float32", "--lr", "3e-3"]


def probe(model, target) -> torch.Tensor:
    """(n, V) draft distributions over fixed pairs (feature at t, token t + 1) at positions 0 .. n - 1."""
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, target.vocab_size, (1, 6), generator=generator)
    with torch.inference_mode():
        features = target.model.model(input_ids=tokens)[0]
        hidden = model(tokens[:, 1:], features[:, :-1], torch.arange(5)[None])
        return torch.softmax(model.logits(hidden)[0], dim=-1)


def test_a_reference_form_head_trained_here_exports_to_the_eagle_layout_and_drafts_the_same(tmp_path, capsys):
    trained, exported = tmp_path / "trained", tmp_path / "exported"
    eagle_train.main([*_train_argv(tmp_path, str(trained)), "--reference-form"])
    assert json.loads((trained / "config.json").read_text())["input_norm"] is False
    saved = load_file(str(trained / "model.safetensors"))
    assert not any("input_layernorm" in name for name in saved)
    target = sf.load_target(str(tmp_path / "target"))
    initial = build_model(target.model, seed=0, input_norm=False).state_dict()
    assert saved.keys() == initial.keys() and not torch.equal(saved["fc.weight"], initial["fc.weight"])  # trained

    capsys.readouterr()
    zoo_main(["export", "--drafter", "eagle", "--layout", "eagle", "--weights", str(trained),
              "--target", str(tmp_path / "target"), "--out", str(exported)])
    assert capsys.readouterr().out.strip() == f"eagle written to {exported} (eagle layout)"
    tensors = torch.load(exported / "pytorch_model.bin", weights_only=True)
    assert sorted(k for k in tensors if not k.startswith("layers.0.")) == ["embed_tokens.weight", "fc.bias",
                                                                           "fc.weight"]
    assert "layers.0.input_layernorm.weight" not in tensors  # EAGLE's layer 0 has none
    assert torch.equal(tensors["fc.weight"], saved["fc.weight"])

    ours = sf.create_drafter("eagle", target, weights=str(trained))
    theirs = sf.create_drafter("eagle", target, weights=str(exported))
    assert not ours.model.input_norm and not theirs.model.input_norm
    torch.testing.assert_close(probe(theirs.model, target), probe(ours.model, target), rtol=0, atol=0)

    for options in ({"mode": "chain", "gamma": 3}, {"mode": "tree", "gamma": 3, "top_k": 2, "total_tokens": 6}):
        drafter = sf.create_drafter("eagle", target, weights=str(exported), **options)
        for prompt in ([1, 5, 9, 2], [7, 7, 3, 30, 4, 11]):
            expected = sf.generate(target, None, prompt, 24).tokens
            result = sf.generate(target, drafter, prompt, 24)
            assert result.tokens == expected, options
            assert result.metrics.proposed_tokens > 0  # drafts were proposed and verified


def test_the_default_form_is_refused_by_the_eagle_layout_and_resuming_across_forms_is_refused(tmp_path):
    trained = tmp_path / "trained"
    eagle_train.main(_train_argv(tmp_path, str(trained), steps=4))
    assert json.loads((trained / "config.json").read_text())["input_norm"] is True
    assert "layer.input_layernorm.weight" in load_file(str(trained / "model.safetensors"))
    with pytest.raises(SystemExit) as stop:
        zoo_main(["export", "--drafter", "eagle", "--weights", str(trained), "--target", str(tmp_path / "target"),
                  "--out", str(tmp_path / "o")])
    assert str(stop.value.code) == (
        "specfamily-zoo export: this eagle head normalises its layer input (input_layernorm); EAGLE's layer 0 has "
        "no input norm, so it has no exact EAGLE-repo form (train it with --reference-form to export it)")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match=r"trained\.train\.pt was trained without --reference-form; resume it the "
                                         r"same way or use another --ckpt$"):
        eagle_train.main([*_train_argv(tmp_path, str(trained), steps=8), "--reference-form"])


def test_the_flag_only_removes_the_input_norm_and_is_stored_in_the_checkpoint(tmp_path):
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    normed, plain = build_model(target.model, seed=4), build_model(target.model, seed=4, input_norm=False)
    assert normed.input_norm and not plain.input_norm
    assert set(normed.state_dict()) - set(plain.state_dict()) == {"layer.input_layernorm.weight"}
    assert all(torch.equal(value, normed.state_dict()[key]) for key, value in plain.state_dict().items())
    assert (probe(normed, target) - probe(plain, target)).abs().max() > 1e-3  # the norm matters
    save_eagle(tmp_path / "plain", plain, target.model)
    loaded, config = load_eagle(tmp_path / "plain", target.model)
    assert config["input_norm"] is False and not loaded.input_norm
    torch.testing.assert_close(probe(loaded, target), probe(plain, target), rtol=0, atol=0)
    config["input_norm"] = "no"
    (tmp_path / "plain" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"plain': input_norm must be true or false, got 'no'$"):
        load_eagle(tmp_path / "plain", target.model)
    with pytest.raises(ValueError, match=r"the eagle reference form \(no input norm\) is EAGLE's Llama layer 0; the "
                                         r"target is 'gpt2'$"):
        build_model(tiny_target("gpt2", vocab_size=32).model, input_norm=False)
    assert eagle_train.parse_args(["--target", "t", "--out", "o", "--tokens", "a.npy"]).reference_form is False
    assert eagle_train.parse_args(["--target", "t", "--out", "o", "--tokens", "a.npy",
                                   "--reference-form"]).reference_form is True


def test_shipped_heads_written_before_the_flag_load_in_the_default_form():
    from specfamily import zoo

    folder = zoo.zoo_path("zoo:code-eagle")
    assert "input_norm" not in json.loads((folder / "config.json").read_text())
    target = sf.load_target("zoo:code-target")
    model, _ = load_eagle("zoo:code-eagle", target.model)
    assert model.input_norm
    stored = load_file(str(folder / "model.safetensors"))["layer.input_layernorm.weight"]
    assert torch.equal(model.layer.input_layernorm.weight, stored.to(model.layer.input_layernorm.weight.dtype))
