import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import specfamily as sf
from specfamily.drafters.medusa.calibrate import target_features
from specfamily.drafters.medusa.checkpoint import read_checkpoint
from specfamily.drafters.medusa.heads import build_heads, shape_for
from specfamily.drafters.medusa.train import (
    MedusaTraining,
    TrainConfig,
    argmax_labels,
    parse_args,
    recalibrate,
    train,
)
from specfamily.testing import tiny_target
from specfamily.train.tokens import greedy_windows


def _greedy_stream(target, docs: int, length: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, target.vocab_size, (docs, 4), generator=gen)
    with torch.no_grad():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=length, min_new_tokens=length, pad_token_id=0)
    return torch.cat([out, torch.zeros(docs, 1, dtype=out.dtype)], dim=1).reshape(-1).numpy().astype(np.uint16)


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)


@pytest.fixture
def zoo_dir(tmp_path, target):
    np.save(tmp_path / "train.npy", _greedy_stream(target, 12, 60, seed=0))
    np.save(tmp_path / "heldout.npy", _greedy_stream(target, 4, 60, seed=1))
    return tmp_path


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Medusa's schedule at ``step`` before any time is spent."""
    return MedusaTraining(cfg).settings.budget.learning_rate(step, 0.0)


def _config(zoo_dir, **overrides):
    base = dict(target="tiny", zoo_dir=str(zoo_dir), out=str(zoo_dir / "run"), num_heads=3, steps=20, batch=4,
                seq_len=32, lr=3e-3, warmup=2, eval_every=10, eval_windows=4, eval_prompts=2, prompt_len=16,
                eval_tokens=16, ranks=4, max_nodes=8, save_dtype="float32")
    return TrainConfig(**{**base, **overrides})


def test_train_exports_the_best_tau_and_resumes(zoo_dir, target):
    cfg = _config(zoo_dir)
    state = train(cfg, target=target)
    assert state.step == 20 and [row["step"] for row in state.history] == [10, 20]
    taus = [row["tau"] for row in state.history]
    assert state.best_tau == max(taus) > 1.0 and state.best_step == state.history[taus.index(max(taus))]["step"]
    meta = read_checkpoint(zoo_dir / "run" / "heads")
    assert meta.calibration["tau"] == state.best_tau and meta.training["step"] == state.best_step
    assert len(meta.calibration["top1"]) == 3 and 1 <= len(meta.tree) <= 8
    drafter = sf.create_drafter("medusa", target, weights=str(zoo_dir / "run" / "heads"))
    prompt = [5, 9, 2, 7]
    assert sf.generate(target, drafter, prompt, max_new_tokens=30).tokens == \
        sf.generate(target, None, prompt, max_new_tokens=30).tokens

    recal = recalibrate(replace(cfg, recalibrate=str(zoo_dir / "run" / "heads"), export=str(zoo_dir / "recal"),
                                max_nodes=2), target=target)
    assert 1 <= len(recal.tree) <= 2 and read_checkpoint(zoo_dir / "recal").tree == recal.tree
    assert read_checkpoint(zoo_dir / "recal").training == meta.training

    resumed = train(replace(cfg, steps=25, eval_every=5), target=target)
    assert resumed.step == 25 and [row["step"] for row in resumed.history] == [10, 20, 25]
    with pytest.raises(ValueError, match=r"cannot resume .*state.pt: options \['num_heads'\] differ"):
        train(replace(cfg, num_heads=2), target=target)


def test_self_distillation_labels(zoo_dir, target):
    state = train(_config(zoo_dir, labels="greedy", distill_prompt=8, steps=2, eval_every=2, out=str(zoo_dir / "sd")),
                  target=target)
    assert state.step == 2
    windows = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    distilled = greedy_windows(target.model, windows, 5)
    assert distilled.shape == (2, 12) and torch.equal(distilled[:, :5], windows[:, :5])
    for row, prompt in zip(distilled, windows[:, :5], strict=True):
        assert row[5:].tolist() == sf.generate(target, None, prompt, max_new_tokens=7).tokens


def test_argmax_labels_are_the_targets_next_token_choices(zoo_dir, target):
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    features = target_features(target.model, ids)
    labels = argmax_labels(target.model.get_output_embeddings(), features, ids)
    assert labels.shape == ids.shape and torch.equal(labels[:, 0], ids[:, 0])
    for b in range(2):
        for t in range(1, 9):
            assert labels[b, t] == target.model(input_ids=ids[b : b + 1, :t]).logits[0, -1].argmax()
    assert train(_config(zoo_dir, labels="argmax", steps=2, eval_every=2, out=str(zoo_dir / "am")),
                 target=target).step == 2


def test_missing_zoo_arrays_name_the_command(tmp_path, target):
    with pytest.raises(FileNotFoundError, match="run `specfamily-zoo prepare` first"):
        train(_config(tmp_path), target=target)


def test_cli_arguments_and_schedule():
    cfg = parse_args(["--steps", "7", "--share-lm-head", "--no-resume", "--decay", "0.5", "--data", "x.jsonl"])
    assert (cfg.steps, cfg.share_lm_head, cfg.resume, cfg.decay, cfg.data) == (7, True, False, 0.5, "x.jsonl")
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0)
    assert learning_rate(cfg, 0) == pytest.approx(0.1) and learning_rate(cfg, 9) == pytest.approx(1.0)
    assert learning_rate(cfg, 10) == pytest.approx(1.0) and learning_rate(cfg, 100) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="labels must be 'corpus', 'argmax' or 'greedy'"):
        TrainConfig(labels="teacher")


def test_bfloat16_autocast_training_keeps_float32_heads_and_resumes(zoo_dir, target):
    cfg = _config(zoo_dir, dtype="bfloat16", steps=4, eval_every=2, out=str(zoo_dir / "bf16"))
    state = train(cfg, target=target)
    assert state.step == 4 and len(state.history) == 2
    assert all(math.isfinite(loss) for row in state.history for loss in row["loss"])
    saved = torch.load(zoo_dir / "bf16" / "state.pt", weights_only=True)
    assert saved["config"]["dtype"] == "bfloat16" and all(t.dtype == torch.float32 for t in saved["heads"].values())
    fresh = build_heads(target, shape_for(target, 3)).state_dict()
    assert any(not torch.equal(fresh[k], saved["heads"][k]) for k in fresh)  # it trained
    assert train(replace(cfg, steps=6), target=target).step == 6  # and resumes


def test_device_and_dtype_flags_are_parsed_and_checked(capsys, target, zoo_dir):
    cfg = parse_args(["--device", "cuda:0", "--dtype", "float16"])
    assert (cfg.device, cfg.dtype) == ("cuda:0", "float16")
    assert (parse_args([]).device, parse_args([]).dtype) == ("auto", "auto")  # a GPU in bfloat16 when there is one
    for flag, value, message in (("--device", "gpu0", "device must be 'cpu', 'cuda' or 'cuda:N'"),
                                 ("--dtype", "bf16", "dtype must be one of float32, bfloat16, float16")):
        with pytest.raises(SystemExit):
            parse_args([flag, value])
        assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="device must be"):
        TrainConfig(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cuda: CUDA is not available on this machine"):
            train(_config(zoo_dir, device="cuda"), target=target)


def test_the_session_loads_the_target_with_the_products_decoding_will_use(monkeypatch):
    """Recalibrated trees are chosen at decode-time pass costs: matmul auto unless asked."""
    from specfamily.drafters.medusa.train import open_context

    seen = []

    def loading(name, device=None, dtype=None, matmul="exact"):
        seen.append(matmul)
        raise RuntimeError("loaded")

    monkeypatch.setattr("specfamily.core.target.load_target", loading)
    for cfg in (TrainConfig(target="zoo:smollm2"), TrainConfig(target="zoo:smollm2", matmul="exact")):
        with pytest.raises(RuntimeError, match="loaded"):
            open_context(cfg)
    assert seen == ["auto", "exact"]
