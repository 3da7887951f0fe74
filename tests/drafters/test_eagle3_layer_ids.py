"""EAGLE-3 feature-layer ids: each checkpoint layout read and written in its own engines' convention.

Our drafters name target layers as transformers' ``output_hidden_states`` indexes them (0 the embeddings, i the
output of decoder layer i - 1). The expected layers below come from the references, not from our writer:

- EAGLE/SpecForge layout (``eagle_config.eagle_aux_hidden_state_layer_ids``): SGLang's
  ``LlamaForCausalLM.set_eagle3_layers_to_capture`` (python/sglang/srt/models/llama.py) captures each id + 1 on
  entering that layer, i.e. the output of decoder layer id: hidden_states[id + 1]. SpecForge's default ids are
  [1, L // 2 - 1, L - 4] (specforge/algorithms/model_providers.py), its DeepSeek-V3 config (61 layers) says
  [1, 29, 57]. With no ids SGLang captures its default [2, L // 2, L - 3] with no + 1, as the EAGLE repository's
  Llama forward keeps the inputs of decoder layers 2, L // 2, L - 3: hidden_states (2, L // 2, L - 3).
- speculators layout (top-level ``eagle_aux_hidden_state_layer_ids``): vLLM's ``LlamaModel.forward``
  (vllm/model_executor/models/llama.py) keeps the input of decoder layer id: hidden_states[id].
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specfamily as sf
from specfamily.drafters.eagle.drafter import Eagle3Drafter
from specfamily.drafters.eagle.formats3 import load_eagle3, save_eagle3
from specfamily.testing import tiny_target

LAYERS = 8  # decoder layers of the tiny target
SHIPPED = Path(sf.__file__).parent / "zoo" / "weights" / "smollm2-eagle3" / "config.json"
DIMS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
        "max_position_embeddings", "hidden_act", "vocab_size", "rope_theta", "draft_vocab_size")


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", layers=LAYERS)


def third_party(tmp_path: Path, target, layout: str, ids: list[int] | None) -> Path:
    """A folder holding a drafter's tensors (any will do) under a config.json written here by hand in ``layout``
    with feature ids ``ids`` (None: none stated), as SpecForge or speculators would write it: no specfamily entry."""
    folder = save_eagle3(Eagle3Drafter(target, weights="random", seed=1).model, tmp_path / layout, target, layout)
    ours = json.loads((folder / "config.json").read_text())
    if layout == "eagle":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                  "tie_word_embeddings": False, **{key: ours[key] for key in DIMS}}
        if ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "transformer_layer_config": ours["transformer_layer_config"],
                  "draft_vocab_size": ours["draft_vocab_size"], "norm_before_residual": False,
                  "speculators_config": {"algorithm": "eagle3"}}
        if ids is not None:
            config["eagle_aux_hidden_state_layer_ids"] = ids
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("ids", "expected"), [([1, 3, 4], (2, 4, 5)),  # SpecForge's default ids for 8 layers
                                               ([0, 5, 6], (1, 6, 7))])
def test_specforge_ids_name_decoder_layer_outputs(tmp_path, target, ids, expected):
    drafter = sf.create_drafter("eagle3", target, weights=str(third_party(tmp_path, target, "eagle", ids)))
    assert drafter.needs_features == expected  # SGLang: layers_to_capture = id + 1, the output of layer id


def test_an_eagle_checkpoint_without_ids_reads_the_references_default(tmp_path, target):
    drafter = sf.create_drafter("eagle3", target, weights=str(third_party(tmp_path, target, "eagle", None)))
    assert drafter.needs_features == (2, LAYERS // 2, LAYERS - 3)  # SGLang's default, captured with no + 1


@pytest.mark.parametrize("ids", [[1, 4, 6], [0, 2, 8]])
def test_speculators_ids_name_decoder_layer_inputs(tmp_path, target, ids):
    drafter = sf.create_drafter("eagle3", target, weights=str(third_party(tmp_path, target, "speculators", ids)))
    assert drafter.needs_features == tuple(ids)  # vLLM: the input of layer id, hidden_states[id]


def test_specforge_ids_past_the_last_layer_are_refused_naming_both_conventions(tmp_path, target):
    folder = third_party(tmp_path, target, "eagle", [1, 3, LAYERS])  # the output of a ninth layer
    with pytest.raises(ValueError, match=r"feature layers \[1, 3, 8\] \(EAGLE/SpecForge ids, each a decoder "
                                         r"layer's output: hidden_states \[2, 4, 9\]\) do not fit a target of 8 "
                                         r"layers \(hidden_states in \[0, 8\], ids in \[-1, 7\]\)$"):
        load_eagle3(folder, target)


@pytest.mark.parametrize(("layout", "ids"), [("eagle", [1, 3, 6]), ("speculators", [2, 4, 7])])
def test_our_export_states_each_layouts_ids(tmp_path, target, layout, ids):
    drafter = Eagle3Drafter(target, weights="random", layers=[2, 4, 7], seed=2)
    folder = save_eagle3(drafter.model, tmp_path / "ckpt", target, layout)
    config = json.loads((folder / "config.json").read_text())
    holder = config["eagle_config"] if layout == "eagle" else config
    assert holder["eagle_aux_hidden_state_layer_ids"] == ids  # eagle: hidden_states - 1; speculators: as is
    assert config["specfamily"]["hidden_state_ids"] == [2, 4, 7]
    assert sf.create_drafter("eagle3", target, weights=str(folder)).needs_features == (2, 4, 7)


def test_the_embeddings_round_trip_through_the_eagle_layout_as_id_minus_one(tmp_path, target):
    drafter = Eagle3Drafter(target, weights="random", layers=[0, 4, 8], seed=2)  # no engine serves 0 or L
    folder = save_eagle3(drafter.model, tmp_path / "ckpt", target)
    assert json.loads((folder / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] \
        == [-1, 3, 7]
    assert load_eagle3(folder, target).shape.layers == (0, 4, 8)


def edited(folder: Path, edit) -> Path:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_of_ours_from_before_the_conventions_keeps_its_layers(tmp_path, target):
    """Our writer used to put hidden_states indexes in the EAGLE layout too (and no hidden_state_ids record)."""
    folder = save_eagle3(Eagle3Drafter(target, weights="random", layers=[2, 4, 7]).model, tmp_path / "ckpt", target)

    def old_writer(config):
        del config["specfamily"]["hidden_state_ids"]
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 7]

    assert load_eagle3(edited(folder, old_writer), target).shape.layers == (2, 4, 7)


def test_ids_that_disagree_with_our_record_are_refused_naming_both(tmp_path, target):
    folder = save_eagle3(Eagle3Drafter(target, weights="random", layers=[2, 4, 7]).model, tmp_path / "ckpt", target)

    def hand_edit(config):
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 4, 7]

    with pytest.raises(ValueError, match=r"config ids \[2, 4, 7\] \(EAGLE/SpecForge ids, each a decoder layer's "
                                         r"output\) name hidden_states \[3, 5, 8\], but its specfamily entry "
                                         r"records hidden_states \[2, 4, 7\]$"):
        load_eagle3(edited(folder, hand_edit), target)


def test_specforge_deepseek_v3_ids_name_the_references_default_layers():
    from specfamily.drafters.eagle.formats3 import feature_layers

    config = {"architectures": ["LlamaForCausalLMEagle3"],  # SpecForge configs/deepseek-v3-671b-eagle3.json
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57], "use_aux_hidden_state": True}}
    assert feature_layers(config, "eagle", 61, "deepseek") == (2, 30, 58)  # (2, L // 2, L - 3) for 61 layers


def test_the_shipped_smollm2_eagle3_config_names_hidden_states_2_15_27():
    """zoo:smollm2-eagle3 was trained on hidden_states 2, 15, 27 of SmolLM2's 30 layers (its record); read from its
    config.json alone, without the target's weights."""
    from specfamily.drafters.eagle.formats3 import detect_layout, feature_layers

    config = json.loads(SHIPPED.read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]  # SGLang captures 2, 15, 27
    layers = config["specfamily"]["target"]["num_hidden_layers"]
    assert feature_layers(config, detect_layout(config, str(SHIPPED)), layers, str(SHIPPED)) == (2, 15, 27)
    assert config["specfamily"]["hidden_state_ids"] == [2, 15, 27]
