"""`specfamily-zoo prepare` and `train` run end to end on a tiny corpus and export loadable HF folders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from specfamily.zoo.cli import main

TRAIN = ["--batch", "2", "--seq-len", "32", "--eval-windows", "2", "--eval-every", "2", "--ckpt-every", "100",
         "--warmup", "1"]


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
