"""``specfamily-zoo export``: eagle3 to the speculators (vLLM) and EAGLE/SpecForge (SGLang) layouts, eagle and medusa
to their repositories' layouts, through the command line; bad requests refused in one line, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specfamily as sf
from specfamily.drafters.eagle.drafter import Eagle3Drafter
from specfamily.drafters.eagle.formats3 import save_eagle3
from specfamily.drafters.medusa.checkpoint import MedusaCheckpoint, save_checkpoint
from specfamily.drafters.medusa.heads import build_heads, shape_for
from specfamily.io.identity import target_identity
from specfamily.recipes.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
TARGET = str(FIXTURE / "target")


@pytest.fixture(scope="module")
def target():
    from specfamily.core.target import load_target

    return load_target(TARGET)


def eagle3_probe(model, target) -> torch.Tensor:
    """Distributions over target ids of a fixed fused input, two steps deep."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, 4, model.fc.in_features, generator=generator, dtype=target.dtype)
    tokens, positions = torch.tensor([[5, 17, 3, 42]]), torch.arange(4)[None]
    with torch.inference_mode():
        hidden = model(tokens, model.fuse(features), positions)
        again = model(tokens, hidden, positions + 1)
        return model.full_q(torch.softmax(model.logits(torch.cat([hidden, again])), dim=-1))


@pytest.mark.parametrize("layout", ["speculators", "eagle"])
def test_eagle3_exports_to_both_serving_layouts_and_loads_back_the_same(tmp_path, target, layout, capsys):
    drafter = Eagle3Drafter(target, weights="random", layers=[0, 1, 2], draft_vocab=[0, 3, 5, 9, 40], seed=4)
    ours = save_eagle3(drafter.model, tmp_path / "ours", target, layout="eagle")
    out = tmp_path / "out"
    main(["export", "--drafter", "eagle3", "--weights", str(ours), "--target", TARGET, "--out", str(out),
          "--layout", layout])
    assert capsys.readouterr().out.strip() == f"eagle3 written to {out} ({layout} layout)"
    config = json.loads((out / "config.json").read_text())
    assert ("speculators_config" in config) == (layout == "speculators")
    loaded = sf.create_drafter("eagle3", target, weights=str(out))
    torch.testing.assert_close(eagle3_probe(loaded.model, target), eagle3_probe(drafter.model, target), rtol=0, atol=0)


def test_eagle3_export_casts_to_float16(tmp_path, target):
    drafter = Eagle3Drafter(target, weights="random", layers=[0, 1, 2], seed=4)
    ours = save_eagle3(drafter.model, tmp_path / "ours", target)
    main(["export", "--drafter", "eagle3", "--weights", str(ours), "--target", TARGET, "--out", str(tmp_path / "o"),
          "--dtype", "float16"])
    assert json.loads((tmp_path / "o" / "config.json").read_text())["transformer_layer_config"]["torch_dtype"] \
        == "float16"


def test_medusa_exports_to_the_medusa_layout_with_a_shared_head_written_out(tmp_path, target):
    heads = build_heads(target, shape_for(target, num_heads=2, layers=1, share_lm_head=True))
    with torch.no_grad():
        for head in heads.heads:
            head.blocks[0].linear.weight.normal_(0, 0.3)
    ours = save_checkpoint(tmp_path / "ours", heads, MedusaCheckpoint(heads.shape, target_identity(target.model)))
    main(["export", "--drafter", "medusa", "--weights", str(ours), "--target", TARGET, "--out", str(tmp_path / "o"),
          "--base-model", "my/base"])
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"], config["base_model_name_or_path"]) == \
        (2, 1, "my/base")
    tensors = torch.load(tmp_path / "o" / "medusa_lm_head.pt", weights_only=True)
    assert sorted(tensors) == ["0.0.linear.bias", "0.0.linear.weight", "0.1.weight",
                               "1.0.linear.bias", "1.0.linear.weight", "1.1.weight"]
    assert torch.equal(tensors["1.1.weight"], target.model.get_output_embeddings().weight)
    loaded = sf.create_drafter("medusa", target, weights=str(tmp_path / "o")).heads
    features = torch.randn(3, target.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(loaded(features), heads(features), rtol=0, atol=1e-6)  # one batched product vs K


def refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(["export", *argv])
    return str(stop.value.code)


def test_eagle3_export_without_the_embedding_copy_loads_the_same(tmp_path, target):
    """As the zoo ships it: no embed_tokens.weight, so the loader reads the target's own embedding."""
    from safetensors import safe_open

    drafter = Eagle3Drafter(target, weights="random", layers=[0, 1, 2], draft_vocab=[0, 3, 5, 9, 40], seed=4)
    ours = save_eagle3(drafter.model, tmp_path / "ours", target)
    out = tmp_path / "lean"
    main(["export", "--drafter", "eagle3", "--weights", str(ours), "--target", TARGET, "--out", str(out),
          "--layout", "eagle", "--without-embedding"])
    with safe_open(str(out / "model.safetensors"), "pt") as saved, safe_open(str(ours / "model.safetensors"), "pt") \
            as full:
        assert set(full.keys()) - set(saved.keys()) == {"embed_tokens.weight"}
    loaded = sf.create_drafter("eagle3", target, weights=str(out))
    assert loaded.model.embed_tokens is None and loaded.model.embed is target.model.get_input_embeddings()
    torch.testing.assert_close(eagle3_probe(loaded.model, target), eagle3_probe(drafter.model, target), rtol=0, atol=0)
    assert refused(["--drafter", "medusa", "--weights", str(ours), "--target", TARGET, "--out", str(tmp_path / "m"),
                    "--without-embedding"]) == \
        "specfamily-zoo export: --without-embedding applies to eagle3 exports, not medusa"


def test_bad_requests_are_refused_in_one_line_and_write_nothing(tmp_path, target):
    drafter = Eagle3Drafter(target, weights="random", layers=[0, 1, 2], seed=4)
    ours = save_eagle3(drafter.model, tmp_path / "ours", target)
    base = ["--weights", str(ours), "--target", TARGET]
    assert refused(["--drafter", "eagle3", *base, "--out", str(tmp_path / "o"), "--layout", "medusa"]) == \
        "specfamily-zoo export: eagle3 exports to layouts ['speculators', 'eagle'], not 'medusa'"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    assert refused(["--drafter", "eagle3", *base, "--out", str(tmp_path / "full")]) == \
        f"specfamily-zoo export: {str(tmp_path / 'full')!r} already exists and is not an empty folder; export " \
        "writes a new one"
    assert (tmp_path / "full" / "x").read_text() == "keep"
    assert refused(["--drafter", "eagle", *base, "--out", str(tmp_path / "o")]) == \
        f"specfamily-zoo export: {str(ours)!r} holds an EAGLE-3 drafter; load it with create_drafter('eagle3', ...)"
    assert not (tmp_path / "o").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


def test_our_trained_eagle_head_has_no_exact_eagle_repo_form(tmp_path, target):
    from specfamily.drafters.eagle.checkpoint import save_eagle
    from specfamily.drafters.eagle.model import build_model

    ours = save_eagle(tmp_path / "ours", build_model(target.model, seed=2), target.model)
    message = refused(["--drafter", "eagle", "--weights", str(ours), "--target", TARGET, "--out", str(tmp_path / "o")])
    assert message == ("specfamily-zoo export: this eagle head normalises its layer input (input_layernorm); EAGLE's "
                       "layer 0 has no input norm, so it has no exact EAGLE-repo form (train it with --reference-form "
                       "to export it)")
    assert not (tmp_path / "o").exists()


def test_an_eagle_repo_head_exports_to_the_eagle_layout_unchanged(tmp_path, target):
    main(["export", "--drafter", "eagle", "--weights", str(FIXTURE / "eagle_ref"), "--target", TARGET,
          "--out", str(tmp_path / "o")])
    theirs = torch.load(FIXTURE / "eagle_ref" / "pytorch_model.bin", weights_only=True)
    ours = torch.load(tmp_path / "o" / "pytorch_model.bin", weights_only=True)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_medusa_heads_with_different_blocks_have_no_medusa_layout_form(tmp_path, target):
    heads = build_heads(target, shape_for(target, num_heads=1, layers=2))
    with torch.no_grad():
        heads.heads[0].blocks[1].linear.weight.normal_(0, 0.3)
    ours = save_checkpoint(tmp_path / "ours", heads, MedusaCheckpoint(heads.shape, target_identity(target.model)))
    assert refused(["--drafter", "medusa", "--weights", str(ours), "--target", TARGET, "--out", str(tmp_path / "o")]) \
        == ("specfamily-zoo export: Medusa head 0 has 2 different residual blocks; the Medusa reference repeats one "
            "block per head, so these heads have no exact Medusa-layout form")
    assert not (tmp_path / "o").exists()
