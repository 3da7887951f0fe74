"""Training Medusa heads on self-distillation data with stored features (``--distilled``), optionally over a reduced
draft vocabulary (``--draft-vocab``)."""

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

import specfamily as sf
from specfamily.drafters.medusa import train as medusa_train
from specfamily.drafters.medusa.calibrate import target_features
from specfamily.drafters.medusa.checkpoint import read_checkpoint
from specfamily.drafters.medusa.train import TrainConfig, parse_args, train
from specfamily.drafters.shared.draft_vocab import frequent_tokens
from specfamily.recipes.distill import DistillConfig, write_batch
from specfamily.testing import tiny_target
from specfamily.train.distilled import is_heldout, load_distilled

V = 64


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=V, spread=1.0, dtype=torch.float32)


def _turns(heldout: bool, count: int) -> list[str]:
    turns = (f"user turn {i}" for i in range(100000))
    return [turn for turn, _ in zip((t for t in turns if is_heldout(t) == heldout), range(count), strict=False)]


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, target):
    """Two batch files of conversations: a random prompt, then the target's greedy answer, with real features."""
    folder = tmp_path_factory.mktemp("distilled")
    gen = torch.Generator().manual_seed(0)
    turns = _turns(False, 10) + _turns(True, 3)
    for index, batch_turns in enumerate((turns[:6], turns[6:])):
        prompts, convs = [], []
        for _ in batch_turns:
            prompt = torch.randint(0, V, (1, int(torch.randint(4, 9, (1,), generator=gen))), generator=gen)
            with torch.no_grad():
                out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                            max_new_tokens=40, min_new_tokens=40, pad_token_id=0)
            features = target_features(target.model, out)[0, :-1]
            prompts.append(prompt[0].tolist())
            convs.append((out[0].tolist(), features))
        write_batch(DistillConfig(out=str(folder)), index, batch_turns, prompts, convs)
    return folder


def _config(distilled, out, **overrides):
    base = dict(target="tiny", distilled=str(distilled), out=str(out), num_heads=3, steps=4, batch=4, seq_len=32,
                lr=3e-3, warmup=1, eval_every=2, eval_windows=4, eval_prompts=2, eval_tokens=16, ranks=4,
                max_nodes=8, save_dtype="float16")
    return TrainConfig(**{**base, **overrides})


def test_training_on_distilled_data_with_a_draft_vocabulary(distilled, target, tmp_path, monkeypatch):
    train_convs, heldout = load_distilled(distilled)
    assert (len(train_convs), len(heldout)) == (10, 3)

    def no_target_pass(*args, **kwargs):
        raise AssertionError("training on distilled data must read the stored features")

    monkeypatch.setattr(medusa_train, "target_features", no_target_pass)
    cfg = _config(distilled, tmp_path / "run", draft_vocab=12)
    state = train(cfg, target=target)
    assert state.step == 4 and [row["step"] for row in state.history] == [2, 4]
    vocab = frequent_tokens(train_convs.answer_tokens(), 12, V)
    assert state.draft_vocab["size"] == 12 and 0 < state.draft_vocab["coverage_train"] <= 1
    assert 0 <= state.draft_vocab["coverage_heldout"] <= 1
    folder = tmp_path / "run" / "heads"
    meta = read_checkpoint(folder)
    assert meta.shape.draft_vocab == 12 and meta.training["data"] == str(distilled)
    assert meta.training["draft_vocab"] == state.draft_vocab and meta.calibration["tau"] == state.best_tau
    ids = load_file(str(folder / "model.safetensors"))["draft_ids"]
    assert ids.dtype == torch.int64 and torch.equal(ids, vocab.ids)
    drafter = sf.create_drafter("medusa", target, weights=str(folder))
    prompt = heldout.prompt(0)
    result = sf.generate(target, drafter, prompt, max_new_tokens=24)
    assert result.tokens == sf.generate(target, None, prompt, max_new_tokens=24).tokens

    resumed = train(replace(cfg, steps=6), target=target)
    assert resumed.step == 6 and [row["step"] for row in resumed.history] == [2, 4, 6]
    with pytest.raises(ValueError, match="cannot resume .*state.pt: it was trained with another draft vocabulary"):
        train(replace(cfg, steps=8, draft_vocab=10), target=target)
    with pytest.raises(ValueError, match="cannot resume .*state.pt: it was trained with another draft vocabulary"):
        train(replace(cfg, steps=8, draft_vocab=0), target=target)


def test_full_vocabulary_argmax_labels_on_distilled_data(distilled, target, tmp_path):
    state = train(_config(distilled, tmp_path / "run", labels="argmax", steps=2, eval_every=2), target=target)
    assert state.step == 2 and state.draft_vocab == {}
    assert read_checkpoint(tmp_path / "run" / "heads").shape.draft_vocab == 0


def test_distilled_options_are_parsed_and_checked():
    cfg = parse_args(["--distilled", "data/distilled", "--draft-vocab", "4096"])
    assert (cfg.distilled, cfg.draft_vocab) == ("data/distilled", 4096)
    with pytest.raises(ValueError, match="distilled data is the target's greedy text already"):
        TrainConfig(distilled="x", labels="greedy")
    with pytest.raises(ValueError, match="draft_vocab must be an integer >= 0"):
        TrainConfig(draft_vocab=-1)
    with pytest.raises(ValueError, match="draft_vocab 4 is smaller than the 10 ranks measured"):
        TrainConfig(draft_vocab=4)


def test_distilled_data_of_another_target_is_refused(distilled, tmp_path):
    other = tiny_target("llama", vocab_size=V, hidden=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="was not distilled from this target"):
        train(_config(distilled, tmp_path / "run"), target=other)
