"""EAGLE training: the objective aligns features, checkpoints round-trip and refuse other targets, runs resume."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

import specfamily as sf
import specfamily.drafters.eagle.train as eagle_train
from specfamily.drafters.eagle.checkpoint import load_eagle, save_eagle
from specfamily.drafters.eagle.drafter import EagleDrafter
from specfamily.drafters.eagle.model import build_model
from specfamily.drafters.eagle.objective import eagle_loss, measure_tau, top1_agreement
from specfamily.drafters.eagle.train import TrainConfig, train
from specfamily.testing import tiny_model, tiny_target
from specfamily.train.loop import read_state


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_brief_training_learns_feature_t_plus_token_to_feature_t_plus_1(family):
    """Trained on (f[t], x[t + 1]) -> f[t + 1], the drafter agrees with the target and is accepted in the loop
    (qwen2 with grouped-query attention, as in Qwen2.5)."""
    target = tiny_target(family, vocab_size=64, spread=2.0, dtype=torch.float32, kv_heads=1 if family == "qwen2" else 2)
    target.model.requires_grad_(False)
    model = build_model(target.model).train()
    gen = torch.Generator().manual_seed(0)
    heldout = torch.randint(0, 64, (8, 32), generator=gen)
    prompts = [torch.randint(0, 64, (8,), generator=gen) for _ in range(4)]
    before = top1_agreement(model, target.model, heldout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        parts = eagle_loss(model, target.model, torch.randint(0, 64, (16, 32), generator=gen), gen, noise=0.0)
        optimizer.zero_grad()
        parts.loss.backward()
        optimizer.step()
    model.eval()
    after = top1_agreement(model, target.model, heldout)
    assert before < 0.1 and after > 0.4, (before, after)
    assert measure_tau(target, model, prompts, 32) > 1.8
    assert measure_tau(target, model, prompts, 32, mode="chain") > (1.8 if family == "llama" else 1.5)  # untrained ~1
    drafter = EagleDrafter(target, weights=model)
    for prompt in prompts:  # greedy output is the target's own
        assert sf.generate(target, drafter, prompt, 32).tokens == sf.generate(target, None, prompt, 32).tokens


@pytest.mark.parametrize("dtype", [None, torch.float16])
def test_checkpoint_round_trip(tmp_path, dtype):
    target = tiny_target("gpt2", vocab_size=32, spread=1.0)
    model = build_model(target.model, seed=5)
    save_eagle(tmp_path / "eagle", model, target.model, info={"note": "test"}, dtype=dtype)
    loaded, config = load_eagle(tmp_path / "eagle", target.model)
    assert config["info"] == {"note": "test"} and config["family"] == "gpt2"
    for key, value in model.state_dict().items():
        expected = value if dtype is None else value.to(dtype).to(value.dtype)
        assert torch.equal(loaded.state_dict()[key], expected), key
    if dtype is None:
        by_path = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), gamma=3)
        in_memory = EagleDrafter(target, weights=model, gamma=3)
        sampling = sf.SamplingConfig(temperature=1.0)
        a = sf.generate(target, by_path, [1, 2, 3], 20, sampling=sampling, seed=4)
        b = sf.generate(target, in_memory, [1, 2, 3], 20, sampling=sampling, seed=4)
        assert a.tokens == b.tokens and a.metrics.accepted_tokens == b.metrics.accepted_tokens


def test_weights_for_another_target_are_refused(tmp_path):
    target = tiny_target("llama", vocab_size=32)
    save_eagle(tmp_path / "eagle", build_model(target.model), target.model)
    other = tiny_target("llama", vocab_size=32, seed=1)
    with pytest.raises(ValueError, match=r"eagle weights '.*eagle' were trained for another target \(saved vs this "
                                         r"target: weights differ\); train a drafter for this target"):
        sf.create_drafter("eagle", other, weights=str(tmp_path / "eagle"))
    wider = tiny_target("llama", vocab_size=32, hidden=48)
    with pytest.raises(ValueError, match="hidden_size 32 != 48"):
        load_eagle(tmp_path / "eagle", wider.model)


def test_missing_or_foreign_checkpoints_are_refused(tmp_path):
    target = tiny_target("llama", vocab_size=32)
    with pytest.raises(FileNotFoundError, match="no eagle checkpoint at"):
        load_eagle(tmp_path / "nothing", target.model)
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="is not an eagle checkpoint"):
        load_eagle(folder, target.model)


def _tiny_run(tmp_path):
    tiny_model("llama", 32, dtype=torch.float32, spread=2.0).save_pretrained(tmp_path / "target")
    np.save(tmp_path / "tokens.npy", np.random.default_rng(0).integers(0, 32, 5000).astype(np.uint16))
    return dict(target=str(tmp_path / "target"), tokens=str(tmp_path / "tokens.npy"), steps=6, minutes=0.0,
                batch=2, seq_len=16, warmup=2, eval_every=3, ckpt_every=3, eval_windows=2, tau_prompts=2,
                tau_prompt_len=8, tau_tokens=8, save_dtype="float32")


_TRAIN_STEP = eagle_train.train_step


def _recording_steps(monkeypatch, losses: list, crash_at: int | None = None) -> None:
    """Record (step, regression, cross-entropy) of every train_step; raise KeyboardInterrupt before ``crash_at``."""
    real_step = _TRAIN_STEP

    def step(run, data):
        if run.state.step == crash_at:
            raise KeyboardInterrupt
        before = run.state.step
        loss, (regression, classification) = real_step(run, data)
        losses.append((before, regression, classification))
        return loss, (regression, classification)

    monkeypatch.setattr(eagle_train, "train_step", step)


def test_training_resumes_exactly_and_exports_the_best_tau(tmp_path, monkeypatch):
    options = _tiny_run(tmp_path)
    straight_losses, crashed_losses, resumed_losses = [], [], []
    _recording_steps(monkeypatch, straight_losses)
    straight = train(TrainConfig(out=str(tmp_path / "a"), **options))
    assert straight.step == 6
    exported = json.loads((tmp_path / "a" / "config.json").read_text())["info"]
    assert exported["tau"] == straight.best_tau and exported["step"] == straight.best_step

    _recording_steps(monkeypatch, crashed_losses, crash_at=4)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(out=str(tmp_path / "b"), **options))
    _recording_steps(monkeypatch, resumed_losses)
    resumed = train(TrainConfig(out=str(tmp_path / "b"), **options))  # picks up the step-3 state
    same = dataclasses.replace(resumed, seconds=straight.seconds)
    assert same == straight  # step, tokens seen, best tau and its step, last evaluations (seconds aside)
    assert [s for s, *_ in resumed_losses] == [3, 4, 5]
    assert crashed_losses == straight_losses[:4]
    assert resumed_losses == straight_losses[3:]  # step 3 again (its state was saved before it), then on: the same
    a = read_state(tmp_path / "a.train.pt")
    b = read_state(tmp_path / "b.train.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["generator"], b["generator"])
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert all(torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])) for k in x)
    target = sf.load_target(str(tmp_path / "target"))
    sf.create_drafter("eagle", target, weights=str(tmp_path / "b"))  # the export loads for its target


class _Planted:
    """Unpickling this runs code: it creates the file ``marker``."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_resume_file_that_would_run_code_is_refused_unrun(tmp_path):
    options = _tiny_run(tmp_path)
    marker, ckpt = tmp_path / "ran.txt", tmp_path / "planted.train.pt"
    torch.save({"state": {"step": 5}, "model": _Planted(marker)}, ckpt)
    with pytest.raises(ValueError, match=r"refusing to resume from '.*planted.train.pt': it holds objects other "
                                         r"than tensors and plain containers"):
        train(TrainConfig(out=str(tmp_path / "c"), ckpt=str(ckpt), **options))
    assert not marker.exists()
    torch.load(ckpt, weights_only=False)  # the plant works: a full unpickle would have run it
    assert marker.exists()


def test_bfloat16_autocast_training_runs_with_float32_weights(tmp_path, monkeypatch):
    options = {**_tiny_run(tmp_path), "steps": 3, "eval_every": 0, "ckpt_every": 0}
    losses = []
    _recording_steps(monkeypatch, losses)
    state = train(TrainConfig(out=str(tmp_path / "bf16"), dtype="bfloat16", **options))
    assert state.step == 3 and len(losses) == 3
    assert all(math.isfinite(r) and math.isfinite(c) for _, r, c in losses)
    saved = read_state(tmp_path / "bf16.train.pt")
    assert saved["config"]["dtype"] == "bfloat16"
    assert all(t.dtype == torch.float32 for t in saved["model"].values())
    reference = build_model(sf.load_target(str(tmp_path / "target")).model, seed=0).state_dict()
    assert any(not torch.equal(reference[k], saved["model"][k]) for k in reference)  # it trained


def test_device_and_dtype_flags_are_parsed_and_checked(capsys):
    base = ["--target", "t", "--out", "o", "--tokens", "a.npy"]
    cfg = eagle_train.parse_args([*base, "--device", "cuda:1", "--dtype", "float16"])
    assert (cfg.device, cfg.dtype) == ("cuda:1", "float16")
    assert (eagle_train.parse_args(base).device, eagle_train.parse_args(base).dtype) == ("auto", "auto")
    for flag, value, message in (("--device", "gpu", "device must be 'cpu', 'cuda' or 'cuda:N'"),
                                 ("--dtype", "half", "dtype must be one of float32, bfloat16, float16")):
        with pytest.raises(SystemExit):
            eagle_train.parse_args([*base, flag, value])
        assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="dtype must be one of"):
        TrainConfig(target="t", out="o", tokens="a.npy", dtype="fp16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="--device cuda: CUDA is not available on this machine"):
        train(TrainConfig(out=str(tmp_path / "d"), device="cuda", **_tiny_run(tmp_path)))


def test_training_config_needs_one_data_source():
    with pytest.raises(ValueError, match="give exactly one data source"):
        TrainConfig(target="t", out="o")
    with pytest.raises(ValueError, match="give exactly one data source"):
        TrainConfig(target="t", out="o", tokens="a.npy", dataset="json")
