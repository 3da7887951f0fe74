"""EAGLE-1/2 and Medusa heads in their repositories' layouts, against the reference packages' own outputs.

tests/fixtures/reference/ holds a tiny Llama, an EAGLE-1 head built and saved by eagle-llm 1.2.1's classes, Medusa
heads built and saved by medusa-llm 0.1's, and what those classes computed on fixed inputs (build.py, side venv).
Here: our loaders read those folders and draft the same distributions; our exports (make_exports.py, fixed seeds)
equal the committed ones, which the reference classes loaded and computed the same as we do.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specfamily as sf
from specfamily.drafters.eagle.formats import load_eagle_repo
from specfamily.drafters.medusa.formats import load_medusa_repo
from specfamily.testing import tiny_target

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "reference"
TOL = {"rtol": 0, "atol": 2e-6}  # float32: probabilities of 64 tokens, summed over 32-wide dot products


def _make_exports():
    spec = importlib.util.spec_from_file_location("make_exports", HERE / "make_exports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def target():
    return _make_exports().fixture_target()


@pytest.fixture(scope="module")
def expected():
    return load_file(str(HERE / "expected.safetensors"))


def features(target, tokens: torch.Tensor) -> torch.Tensor:
    """(1, n, H) our target's last hidden state (after the final norm), as the drafters receive it."""
    with torch.inference_mode():
        return target.model.model(input_ids=tokens)[0]


def eagle_probs(model, target, tokens: torch.Tensor) -> torch.Tensor:
    """(n - 1, V) our EAGLE model over the pairs (f[t], x[t + 1]) at positions t, as build.py asks the reference."""
    hidden = features(target, tokens)
    n = tokens.shape[1] - 1
    with torch.inference_mode():
        return torch.softmax(model.logits(model(tokens[:, 1:], hidden[:, :-1], torch.arange(n)[None]))[0], dim=-1)


def medusa_probs(heads, target, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.softmax(heads(features(target, tokens)[0]), dim=-1)


def test_the_fixture_target_computes_what_it_computed_under_the_reference_transformers(target, expected):
    torch.testing.assert_close(features(target, expected["tokens"])[0], expected["features"], **TOL)


def test_an_eagle_repo_head_drafts_what_eagle_llm_computes(target, expected):
    drafter = sf.create_drafter("eagle", target, weights=str(HERE / "eagle_ref"))
    assert isinstance(drafter.model.layer.input_layernorm, torch.nn.Identity)  # EAGLE's layer 0 has no input norm
    ours = eagle_probs(drafter.model, target, expected["tokens"])
    torch.testing.assert_close(ours, expected["eagle_probs"], **TOL)
    torch.testing.assert_close(ours, expected["eagle_reloaded_probs"], **TOL)  # eagle-llm's own load path


def test_medusa_repo_heads_draft_what_medusa_llm_computes(target, expected):
    drafter = sf.create_drafter("medusa", target, weights=str(HERE / "medusa_ref"))
    assert drafter.heads.shape.num_heads == 3 and drafter.heads.shape.layers == 1
    torch.testing.assert_close(medusa_probs(drafter.heads, target, expected["tokens"]), expected["medusa_probs"], **TOL)


def test_a_medusa_repo_checkpoint_in_safetensors_with_prefixed_keys_loads_the_same(tmp_path, target, expected):
    from safetensors.torch import save_file

    tensors = torch.load(HERE / "medusa_ref" / "medusa_lm_head.pt", weights_only=True)
    folder = tmp_path / "medusa"
    folder.mkdir()
    prefixed = {f"medusa_head.{k}": v.contiguous() for k, v in tensors.items()}  # a full model's key names
    save_file(prefixed, str(folder / "medusa_lm_head.safetensors"))
    shutil.copy(HERE / "medusa_ref" / "config.json", folder / "config.json")
    heads = load_medusa_repo(folder, target)
    torch.testing.assert_close(medusa_probs(heads, target, expected["tokens"]), expected["medusa_probs"], **TOL)


def test_our_exports_are_reproducible_and_the_reference_computes_what_we_do(tmp_path, target):
    fresh = _make_exports().write_exports(tmp_path, target)
    for name, weights in (("eagle", "pytorch_model.bin"), ("eagle_trained", "pytorch_model.bin"),
                          ("medusa", "medusa_lm_head.pt")):
        committed = HERE / "exports" / name
        configs = [json.loads((folder / "config.json").read_text()) for folder in (fresh / name, committed)]
        assert configs[0] == configs[1]
        ours, theirs = (torch.load(f / name / weights, weights_only=True) for f in (fresh, HERE / "exports"))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    recorded, tokens = load_file(str(HERE / "expected_exports.safetensors")), load_file(
        str(HERE / "expected.safetensors"))["tokens"]
    eagle = sf.create_drafter("eagle", target, weights=str(fresh / "eagle")).model
    medusa = sf.create_drafter("medusa", target, weights=str(fresh / "medusa")).heads
    torch.testing.assert_close(eagle_probs(eagle, target, tokens), recorded["eagle_probs"], **TOL)
    torch.testing.assert_close(medusa_probs(medusa, target, tokens), recorded["medusa_probs"], **TOL)
    reference_input = load_file(str(HERE / "expected.safetensors"))["eagle_probs"]
    assert (recorded["eagle_probs"] - reference_input).abs().max() > 1e-3  # the export is not the input unchanged
    trained = sf.create_drafter("eagle", target, weights=str(fresh / "eagle_trained")).model  # ours, reference form
    assert not trained.input_norm
    torch.testing.assert_close(eagle_probs(trained, target, tokens), recorded["eagle_trained_probs"], **TOL)


def small_vocab_target():
    """The fixture target's architecture over a 16-token vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specfamily.core.target import load_target

    config = LlamaConfig.from_pretrained(HERE / "target")
    config.vocab_size = 16
    return load_target(LlamaForCausalLM(config).eval())


def _copy(folder: Path, tmp_path: Path, edit=None) -> Path:
    out = tmp_path / folder.name
    shutil.copytree(folder, out)
    if edit is not None:
        config = json.loads((out / "config.json").read_text())
        edit(config)
        (out / "config.json").write_text(json.dumps(config))
    return out


def test_eagle_repo_heads_that_do_not_fit_are_refused_naming_both_sides(tmp_path, target):
    wide = _copy(HERE / "eagle_ref", tmp_path, lambda c: c.update(hidden_size=64))
    with pytest.raises(ValueError, match=r"eagle_ref: checkpoint hidden_size 64 does not fit the target's 32$"):
        load_eagle_repo(wide, target.model)
    rope = _copy(HERE / "eagle_ref", tmp_path / "r", lambda c: c.update(rope_theta=500000.0))
    with pytest.raises(ValueError, match=r"checkpoint rope_theta 500000.0 does not fit the target's 10000.0 \(the "
                                         r"draft layer takes the target's rotary embedding\)$"):
        load_eagle_repo(rope, target.model)
    deep = _copy(HERE / "eagle_ref", tmp_path / "d", lambda c: c.update(num_hidden_layers=2))
    with pytest.raises(ValueError, match=r"2 draft layers; eagle here runs exactly 1$"):
        load_eagle_repo(deep, target.model)
    other = small_vocab_target()
    with pytest.raises(ValueError, match=r"checkpoint vocab_size 64 does not fit the target's 16$"):
        load_eagle_repo(HERE / "eagle_ref", other.model)
    with pytest.raises(ValueError, match=r"holds a Llama decoder layer; the target is 'gpt2'$"):
        load_eagle_repo(HERE / "eagle_ref", tiny_target("gpt2").model)


def test_eagle_repo_tensors_of_the_wrong_shape_or_missing_are_refused(tmp_path, target):
    folder = _copy(HERE / "eagle_ref", tmp_path)
    tensors = torch.load(folder / "pytorch_model.bin", weights_only=True)
    tensors["fc.weight"] = tensors["fc.weight"][:, :40]
    torch.save(tensors, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"fc.weight has shape \(32, 40\); this target needs \(32, 64\)$"):
        load_eagle_repo(folder, target.model)
    del tensors["fc.weight"]
    torch.save(tensors, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"EAGLE checkpoint lacks \['fc.weight'\]$"):
        load_eagle_repo(folder, target.model)


class Payload:
    """Not a tensor: a pickle holding it must not load (weights_only=True)."""


def test_pickled_checkpoints_load_with_weights_only(tmp_path, target):
    eagle = _copy(HERE / "eagle_ref", tmp_path / "e")
    torch.save({"fc.weight": Payload()}, eagle / "pytorch_model.bin")
    with pytest.raises(Exception, match="Weights only load failed"):
        load_eagle_repo(eagle, target.model)
    medusa = _copy(HERE / "medusa_ref", tmp_path / "m")
    torch.save({"0.0.linear.weight": Payload()}, medusa / "medusa_lm_head.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        load_medusa_repo(medusa, target)


def test_medusa_repo_heads_that_do_not_fit_are_refused(tmp_path, target):
    more = _copy(HERE / "medusa_ref", tmp_path / "a", lambda c: c.update(medusa_num_heads=4))
    with pytest.raises(ValueError, match=r"Medusa heads lack \['3.1.weight', '3.0.linear.weight', "
                                         r"'3.0.linear.bias'\] for medusa_num_heads 4, medusa_num_layers 1$"):
        load_medusa_repo(more, target)
    fewer = _copy(HERE / "medusa_ref", tmp_path / "b", lambda c: c.update(medusa_num_heads=2))
    with pytest.raises(ValueError, match=r"tensor '2.0.linear.weight' does not fit the config's medusa_num_heads 2"):
        load_medusa_repo(fewer, target)
    other = small_vocab_target()
    with pytest.raises(ValueError, match=r"projection \(vocabulary, hidden\) \(64, 32\) does not fit the target's "
                                         r"\(16, 32\)$"):
        load_medusa_repo(HERE / "medusa_ref", other)


def test_a_hub_name_is_downloaded_with_snapshot_download(monkeypatch, target, expected):
    import huggingface_hub

    calls = []

    def download(repo_id, allow_patterns=None, **_):
        calls.append((repo_id, tuple(allow_patterns)))
        return str(HERE / {"someone/eagle-tiny": "eagle_ref", "someone/medusa-tiny": "medusa_ref"}[repo_id])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    eagle = sf.create_drafter("eagle", target, weights="someone/eagle-tiny")
    medusa = sf.create_drafter("medusa", target, weights="someone/medusa-tiny")
    assert [c[0] for c in calls] == ["someone/eagle-tiny", "someone/medusa-tiny"] and "*.safetensors" in calls[0][1]
    torch.testing.assert_close(eagle_probs(eagle.model, target, expected["tokens"]), expected["eagle_probs"], **TOL)
    torch.testing.assert_close(medusa_probs(medusa.heads, target, expected["tokens"]), expected["medusa_probs"], **TOL)


def test_a_hub_name_that_cannot_be_downloaded_says_so(monkeypatch, target):
    import huggingface_hub

    def offline(repo_id, **_):
        raise ConnectionError("no network\nmore detail")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(FileNotFoundError, match=r"^'someone/eagle-tiny' is neither a folder here nor downloadable "
                                                r"from the model hub \(ConnectionError: no network\)$"):
        sf.create_drafter("eagle", target, weights="someone/eagle-tiny")


def eagle3_probs(model, recorded) -> torch.Tensor:
    """(n, V) our EAGLE-3 draft over target ids on build_eagle3.py's fixed fused features, positions 0 .. n - 1."""
    tokens = recorded["tokens"]
    with torch.inference_mode():
        hidden = model(tokens, model.fuse(recorded["features"][None]), torch.arange(tokens.shape[1])[None])
        return model.full_q(torch.softmax(model.logits(hidden), dim=-1))[0]


def test_a_speculators_eagle3_drafts_what_speculators_computes(target):
    recorded = load_file(str(HERE / "expected_eagle3.safetensors"))
    drafter = sf.create_drafter("eagle3", target, weights=str(HERE / "eagle3_ref"))
    assert drafter.needs_features == (0, 1, 2) and drafter.model.vocab.size == 16
    torch.testing.assert_close(eagle3_probs(drafter.model, recorded), recorded["probs"], **TOL)


def test_a_specforge_eagle3_drafts_what_specforge_computes(target):
    recorded = load_file(str(HERE / "expected_eagle3.safetensors"))
    drafter = sf.create_drafter("eagle3", target, weights=str(HERE / "specforge_ref"))
    # its ids [0, 0, 1] name decoder-layer outputs (SGLang captures id + 1): hidden_states 1, 1, 2
    assert drafter.needs_features == (1, 1, 2) and drafter.model.vocab.size == 16
    torch.testing.assert_close(eagle3_probs(drafter.model, recorded),
                               load_file(str(HERE / "expected_specforge.safetensors"))["probs"], **TOL)


@pytest.mark.parametrize(("layout", "recorded_by"), [("eagle3", "expected_eagle3_exports"),
                                                      ("eagle3_sglang", "expected_specforge_exports")])
def test_our_eagle3_exports_are_reproducible_and_the_reference_computes_what_we_do(tmp_path, target, layout,
                                                                                    recorded_by):
    fresh = _make_exports().write_exports(tmp_path, target) / layout
    committed = HERE / "exports" / layout
    assert json.loads((fresh / "config.json").read_text()) == json.loads((committed / "config.json").read_text())
    ours, theirs = (load_file(str(folder / "model.safetensors")) for folder in (fresh, committed))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    recorded = load_file(str(HERE / "expected_eagle3.safetensors"))
    model = sf.create_drafter("eagle3", target, weights=str(fresh)).model
    torch.testing.assert_close(eagle3_probs(model, recorded),
                               load_file(str(HERE / f"{recorded_by}.safetensors"))["probs"], **TOL)


@pytest.mark.parametrize(("kind", "folder", "options"), [("eagle", "eagle_ref", {"mode": "tree"}),
                                                         ("eagle", "eagle_ref", {"mode": "chain"}),
                                                         ("medusa", "medusa_ref", {}),
                                                         ("eagle3", "eagle3_ref", {}),
                                                         ("eagle3", "specforge_ref", {})])
def test_reference_checkpoints_decode_greedily_as_the_target_does(target, kind, folder, options):
    """The loaded heads draft inside the loop (module path for EAGLE-1's un-normed layer) and lose nothing."""
    from specfamily.core.loop import generate

    drafter = sf.create_drafter(kind, target, weights=str(HERE / folder), gamma=3, **options)
    prompt = [5, 17, 3, 42, 8]
    with torch.inference_mode():
        plain = target.model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)[0, len(prompt):].tolist()
    result = generate(target, drafter, prompt, max_new_tokens=20)
    assert result.tokens == plain and result.metrics.proposed_tokens > 0


def test_medusa_heads_of_repeated_blocks_draft_what_medusa_llm_computes(tmp_path, target):
    recorded = load_file(str(HERE / "expected_medusa2.safetensors"))["medusa_probs"]
    heads = sf.create_drafter("medusa", target, weights=str(HERE / "medusa_ref2")).heads
    assert heads.shape.layers == 2
    tokens = load_file(str(HERE / "expected.safetensors"))["tokens"]
    torch.testing.assert_close(medusa_probs(heads, target, tokens), recorded, **TOL)
    # blocks saved with different weights: the reference's one repeated module ends up holding the last block's
    folder = _copy(HERE / "medusa_ref2", tmp_path)
    tensors = torch.load(folder / "medusa_lm_head.pt", weights_only=True)
    tensors["0.0.linear.weight"] = torch.zeros_like(tensors["0.0.linear.weight"])
    torch.save(tensors, folder / "medusa_lm_head.pt")
    torch.testing.assert_close(medusa_probs(load_medusa_repo(folder, target), target, tokens), recorded, **TOL)


def test_an_eagle3_checkpoint_given_to_eagle_names_the_right_drafter(target):
    for folder in ("eagle3_ref", "specforge_ref"):
        with pytest.raises(ValueError, match=r"holds an EAGLE-3 drafter; load it with create_drafter\('eagle3', "
                                             r"\.\.\.\)$"):
            sf.create_drafter("eagle", target, weights=str(HERE / folder))
