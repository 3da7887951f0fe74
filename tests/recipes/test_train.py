"""`specfamily-zoo prepare` and `train` run end to end on a tiny corpus and export loadable HF folders; `--device` and
`--dtype` (16-bit autocast over float32 weights); checkpoints load tensors only."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from specfamily.recipes.cli import main
from specfamily.recipes.train import TrainConfig, train

TRAIN = ["--batch", "2", "--seq-len", "32", "--eval-windows", "2", "--eval-every", "2", "--ckpt-every", "100",
         "--warmup", "1"]
TINY = ["--kind", "tiny", *TRAIN]


def test_prepare_then_train_then_load(tiny_corpus, tmp_path):
    work = tmp_path / "work"
    main(["prepare", "--workdir", str(work), "--root", str(tiny_corpus), "--vocab-size", "300"])
    meta = json.loads((work / "corpus.json").read_text())
    assert meta["heldout_files"] and meta["train_tokens"] == len(np.load(work / "train.npy"))
    out = tmp_path / "tiny-model"
    main(["train", "--kind", "tiny", "--workdir", str(work), "--out", str(out), "--steps", "3", *TRAIN])
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out))
    assert model.config.vocab_size == len(tokenizer) and model.config.tie_word_embeddings
    assert tokenizer.eos_token_id == 0
    info = json.loads((out / "training.json").read_text())
    assert info["state"]["step"] == 3
    ids = torch.tensor([tokenizer("def f(x):", add_special_tokens=False)["input_ids"]])
    assert torch.isfinite(model(input_ids=ids).logits).all()
    assert not (out.parent / "tiny-model.tmp").exists()


def test_train_resumes_from_checkpoint_and_distils(prepared, tmp_path):
    out = tmp_path / "target"
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(out), "--steps", "2", *TRAIN])
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(out), "--steps", "3", *TRAIN])
    assert json.loads((out / "training.json").read_text())["state"]["step"] == 3  # resumed at 2, not 0
    draft = tmp_path / "draft"
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(draft), "--steps", "2",
          "--teacher", str(out), *TRAIN])
    state = json.loads((draft / "training.json").read_text())["state"]
    assert state["step"] == 2 and np.isfinite(state["heldout_loss"])


def test_a_warm_restart_records_the_runs_before_it(prepared, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(first), "--steps", "2", *TRAIN])
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(second), "--steps", "3",
          "--init-from", str(first), *TRAIN])
    info = json.loads((second / "training.json").read_text())
    assert [run["state"]["step"] for run in info["earlier_runs"]] == [2]
    assert info["tokens_seen_total"] == info["state"]["tokens_seen"] + info["earlier_runs"][0]["state"]["tokens_seen"]
    assert info["tokens_seen_total"] == (2 + 3) * 2 * 32  # steps x batch x seq_len


def test_a_rerun_with_other_options_does_not_resume_the_old_run(prepared, tmp_path):
    out = tmp_path / "run"
    main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(out), "--steps", "2", *TRAIN])
    with pytest.raises(ValueError, match=r"cannot resume .*ckpt-run.pt: options \['teacher'\] differ"):
        main(["train", "--kind", "tiny", "--workdir", str(prepared), "--out", str(out), "--steps", "3",
              "--teacher", str(out), *TRAIN])


def test_bfloat16_training_from_the_cli_keeps_float32_weights_and_resumes(prepared, tmp_path):
    out = tmp_path / "bf16"
    main(["train", "--workdir", str(prepared), "--out", str(out), "--steps", "2", "--dtype", "bfloat16", *TINY])
    saved = torch.load(prepared / "ckpt-bf16.pt", weights_only=True)
    assert saved["config"]["dtype"] == "bfloat16" and saved["state"]["step"] == 2
    assert math.isfinite(saved["state"]["heldout_loss"])
    assert all(t.dtype == torch.float32 for t in saved["model"].values())
    saved["state"]["tokens_seen"] = 1000  # a mark only a resumed run carries on from
    torch.save(saved, prepared / "ckpt-bf16.pt")
    cfg = TrainConfig(kind="tiny", workdir=str(prepared), out=str(out), steps=3, batch=2, seq_len=32, eval_windows=2,
                      eval_every=2, warmup=1, dtype="bfloat16")
    state = train(cfg)
    assert state.step == 3 and state.tokens_seen == 1000 + 2 * 32  # one more step after the saved two


class _Planted:
    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_that_would_run_code_is_not_run(prepared, tmp_path):
    marker = tmp_path / "ran.txt"
    torch.save({"config": {"kind": "tiny"}, "model": _Planted(marker)}, prepared / "ckpt-planted.pt")
    try:
        with pytest.raises(Exception, match="Weights only load failed"):
            main(["train", "--workdir", str(prepared), "--out", str(tmp_path / "planted"), "--steps", "1", *TINY])
    finally:
        (prepared / "ckpt-planted.pt").unlink()
    assert not marker.exists()


def test_bad_device_or_dtype_is_a_clear_error(prepared, tmp_path):
    base = ["train", "--workdir", str(prepared), "--out", str(tmp_path / "x"), "--steps", "1", *TINY]
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16, got 'half'"):
        main([*base, "--dtype", "half"])
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        main([*base, "--device", "gpu"])
