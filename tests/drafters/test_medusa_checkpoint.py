import json

import pytest
import torch

import specfamily as sf
from specfamily.drafters.medusa.checkpoint import (
    MedusaCheckpoint,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.heads import build_heads, shape_for
from specfamily.io.identity import target_identity
from specfamily.testing import tiny_target


def _heads(target, **shape):
    heads = build_heads(target, shape_for(target, **shape))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return heads


def _save(folder, target, heads, tree=None, dtype=None):
    meta = MedusaCheckpoint(heads.shape, target_identity(target.model), tree, {"tau": 1.5}, {"step": 3})
    return save_checkpoint(folder, heads, meta, dtype=dtype)


@pytest.mark.parametrize("share_lm_head", [False, True])
def test_round_trip_restores_heads_tree_and_metadata(tmp_path, share_lm_head):
    target = tiny_target("llama", vocab_size=32)
    heads = _heads(target, num_heads=3, layers=2, share_lm_head=share_lm_head)
    folder = _save(tmp_path / "heads", target, heads, tree=[[0], [1], [0, 0]])
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert [oct(p.stat().st_mode & 0o777) for p in (folder, folder / "model.safetensors")] == ["0o755", "0o644"]
    loaded, meta = load_checkpoint(folder, target)
    assert meta.shape == heads.shape and meta.tree == [[0], [1], [0, 0]]
    assert meta.calibration == {"tau": 1.5} and meta.training == {"step": 3}
    features = torch.randn(4, target.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(loaded(features), heads(features), rtol=0, atol=0)
    drafter = sf.create_drafter("medusa", target, weights=str(folder))
    assert drafter.tree.paths == ((0,), (1,), (0, 0)) and drafter.tree.depth == drafter.policy.next_gamma() == 2
    assert sf.create_drafter("medusa", target, weights=str(folder), num_heads=3).heads.shape.num_heads == 3
    with pytest.raises(ValueError, match="layers=3 conflicts with the checkpoint's layers=2"):
        sf.create_drafter("medusa", target, weights=str(folder), layers=3, num_heads=3)
    with pytest.raises(ValueError, match="num_heads=2 conflicts with the checkpoint's num_heads=3 "):
        sf.create_drafter("medusa", target, weights=str(folder), num_heads=2)


def test_fp16_checkpoint_loads_in_the_targets_dtype(tmp_path):
    target = tiny_target("llama", vocab_size=32)
    heads = _heads(target)
    folder = _save(tmp_path / "heads", target, heads, dtype=torch.float16)
    loaded, _ = load_checkpoint(folder, target)
    assert all(p.dtype == torch.float64 for p in loaded.parameters())
    for (name, a), b in zip(heads.state_dict().items(), loaded.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a.half().double(), msg=name)


def test_saving_again_replaces_the_folder_whole(tmp_path):
    target = tiny_target("llama", vocab_size=32)
    folder = _save(tmp_path / "heads", target, _heads(target, num_heads=4))
    _save(folder, target, _heads(target, num_heads=2))
    assert read_checkpoint(folder).shape.num_heads == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads"]  # no temporary folders left behind


def test_heads_for_another_target_of_the_same_architecture_are_refused(tmp_path):
    trained_for = tiny_target("llama", vocab_size=32, seed=0)
    other = tiny_target("llama", vocab_size=32, seed=1)
    folder = _save(tmp_path / "heads", trained_for, _heads(trained_for))
    with pytest.raises(ValueError, match=r"Medusa heads at .* were trained for another target "
                                         r"\(saved vs this target: weights differ\); train heads"):
        sf.create_drafter("medusa", other, weights=str(folder))


def test_heads_for_another_architecture_are_refused(tmp_path):
    trained_for = tiny_target("llama", vocab_size=32)
    other = tiny_target("llama", vocab_size=32, layers=3)
    folder = _save(tmp_path / "heads", trained_for, _heads(trained_for))
    with pytest.raises(ValueError, match=r"were trained for another target \(saved vs this target: "
                                         r"num_hidden_layers 2 != 3; config sha256 [0-9a-f]{12} != [0-9a-f]{12}; "
                                         r"weights differ\)"):
        MedusaDrafter(other, weights=folder)


def test_identity_ignores_dtype_and_attention_backend(tmp_path):
    trained_for = tiny_target("llama", vocab_size=32, dtype=torch.float64, attn="sdpa")
    same = tiny_target("llama", vocab_size=32, dtype=torch.float32, attn="eager")
    folder = _save(tmp_path / "heads", trained_for, _heads(trained_for))
    loaded, _ = load_checkpoint(folder, same)
    assert next(loaded.parameters()).dtype == torch.float32


def test_missing_or_foreign_checkpoints_are_refused(tmp_path):
    target = tiny_target("llama", vocab_size=32)
    with pytest.raises(FileNotFoundError, match="no Medusa checkpoint at .*missing config.json"):
        MedusaDrafter(target, weights=tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="is not a Medusa checkpoint"):
        MedusaDrafter(target, weights=tmp_path)
