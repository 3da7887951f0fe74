import pytest
import torch

from specfamily.io.identity import check_identity, identity_differences, target_identity
from specfamily.testing import tiny_model


def test_same_weights_in_another_dtype_and_backend_match():
    saved = target_identity(tiny_model("llama", 32, seed=0, dtype=torch.float32, attn="eager"))
    other = tiny_model("llama", 32, seed=0, dtype=torch.float32, attn="sdpa").to(torch.bfloat16)
    assert identity_differences(saved, other) == []
    check_identity(saved, other, "heads")


def test_a_changed_weight_anywhere_is_noticed():
    model = tiny_model("llama", 32, seed=0, dtype=torch.float32)
    saved = target_identity(model)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.add_(0.5)  # not the LM head
    assert identity_differences(saved, model) == ["weights differ"]


def test_the_error_names_what_and_every_difference():
    saved = target_identity(tiny_model("llama", 32, seed=0))
    wider = tiny_model("llama", 32, seed=0, hidden=48)
    with pytest.raises(ValueError, match=r"^my heads were trained for another target \(saved vs this target: "
                                         r"hidden_size 32 != 48; config sha256 [0-9a-f]{12} != [0-9a-f]{12}; "
                                         r"weights differ\); retrain$"):
        check_identity(saved, wider, "my heads", "retrain")


def test_identity_is_plain_json():
    import json

    saved = target_identity(tiny_model("gpt2", 16))
    assert json.loads(json.dumps(saved)) == saved
