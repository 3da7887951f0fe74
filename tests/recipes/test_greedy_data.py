"""`specfamily-zoo greedy-data` and distillation on its windows: the tails are the teacher's greedy text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from specfamily.recipes.cli import main
from specfamily.recipes.greedy_data import GreedyDataConfig, load_greedy_data, make_greedy_data
from specfamily.recipes.train import TrainConfig, train

TRAIN = ["--batch", "2", "--seq-len", "32", "--eval-windows", "2", "--eval-every", "2", "--ckpt-every", "100",
         "--warmup", "1"]


@pytest.fixture(scope="module")
def teacher(prepared, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "tiny"
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(out), "--steps", "2", *TRAIN])
    return out


def test_windows_are_training_text_then_the_teachers_greedy_continuation(prepared, teacher, tmp_path):
    out = tmp_path / "greedy.npy"
    main(["greedy-data", "--workdir", str(prepared), "--teacher", str(teacher), "--out", str(out), "--count", "5",
          "--prompt-len", "6", "--new-tokens", "4", "--batch", "2"])
    windows = np.load(out)
    record = json.loads(out.with_suffix(".json").read_text())
    assert windows.shape == (5, 10) and windows.dtype == np.uint16
    assert record["windows"] == 5 and record["generated_tokens"] == 20
    train_text = np.load(prepared / "train.npy").tobytes()
    model = LlamaForCausalLM.from_pretrained(str(teacher), dtype=torch.float32).eval()
    for row in windows.astype(np.int64):
        assert row[:6].astype(np.load(prepared / "train.npy").dtype).tobytes() in train_text  # a training window
        for t in range(6, 10):
            with torch.no_grad():
                assert row[t] == model(input_ids=torch.tensor(row[None, :t])).logits[0, -1].argmax()


def test_distillation_mixes_greedy_rows_into_each_batch(prepared, teacher, tmp_path):
    data = tmp_path / "greedy.npy"
    make_greedy_data(GreedyDataConfig(str(prepared), str(teacher), str(data), count=4, prompt_len=8, new_tokens=8))
    cfg = TrainConfig(kind="tiny", workdir=str(prepared), out=str(tmp_path / "greedy-draft"), steps=2, batch=2,
                      seq_len=32, eval_windows=2, warmup=1, teacher=str(teacher), greedy_data=str(data),
                      greedy_fraction=0.5)
    state = train(cfg)
    assert state.step == 2 and np.isfinite(state.heldout_loss)
    assert state.tokens_seen == 2 * (32 + 15)  # per step: one corpus row of 32 positions, one greedy row of 15
    info = json.loads((tmp_path / "greedy-draft" / "training.json").read_text())
    assert info["config"]["greedy_data"] == str(data)


def test_bad_greedy_data_and_options_are_refused(prepared, teacher, tmp_path):
    with pytest.raises(FileNotFoundError, match="greedy data 'missing.npy' not found"):
        load_greedy_data("missing.npy", 300)
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros(8, dtype=np.uint16))
    with pytest.raises(ValueError, match=r"expected \(windows, length >= 2\) integer tokens, got uint16 \(8,\)"):
        load_greedy_data(flat, 300)
    wide = tmp_path / "wide.npy"
    np.save(wide, np.full((2, 4), 400, dtype=np.uint16))
    with pytest.raises(ValueError, match="token id 400 is outside the vocabulary of 300"):
        load_greedy_data(wide, 300)
    cfg = TrainConfig(kind="tiny", workdir=str(prepared), out=str(tmp_path / "d"), batch=2, greedy_data=str(wide),
                      greedy_fraction=0.1)
    with pytest.raises(ValueError, match="greedy_fraction 0.1 of a batch of 2 draws no greedy rows"):
        train(cfg)
    with pytest.raises(ValueError, match="out must name a .npy file, got 'x.bin'"):
        make_greedy_data(GreedyDataConfig(str(prepared), str(teacher), "x.bin"))
