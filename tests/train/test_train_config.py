"""Trainers are configured like runs: configs/train/<trainer>.yaml lists every key of the trainer's config with its
default, key=value overrides it, and the older --flags are aliases of the same keys."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from specfamily.drafters.eagle import train as eagle
from specfamily.drafters.medusa import train as medusa
from specfamily.recipes import train as zoo
from specfamily.recipes.cli import main as zoo_main
from specfamily.train.config import compose_config, train_configs

TRAINERS = {"medusa": medusa.TrainConfig, "draft": zoo.TrainConfig, "eagle": eagle.TrainConfig,
            "eagle3": eagle.Eagle3TrainConfig}
SHARED = ("steps", "minutes", "lr", "warmup", "min_lr_ratio", "weight_decay", "clip", "batch", "seq_len", "seed",
          "eval_every", "eval_windows", "ckpt_every", "out", "resume", "device", "dtype")


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_the_shipped_file_lists_every_key_with_its_default(name):
    shipped = OmegaConf.to_container(OmegaConf.load(train_configs() / f"{name}.yaml"))
    fields = {f.name: f for f in dataclasses.fields(TRAINERS[name])}
    assert set(shipped) == set(fields)
    for key, f in fields.items():
        if f.default is not dataclasses.MISSING:
            assert shipped[key] == f.default, key
    assert set(SHARED) <= set(shipped)  # the same names for the same things in every trainer


def test_overrides_and_old_flags_are_the_same_keys():
    new = medusa.parse_args(["steps=7", "minutes=0", "lr=3e-3", "share_lm_head=true", "resume=false"])
    old = medusa.parse_args(["--steps", "7", "--max-minutes", "0", "--lr", "3e-3", "--share-lm-head", "--no-resume"])
    assert new == old == dataclasses.replace(medusa.TrainConfig(), steps=7, minutes=0.0, lr=3e-3, share_lm_head=True,
                                             resume=False)
    assert medusa.parse_args([]) == medusa.TrainConfig()


def test_bad_keys_and_values_are_refused_by_name():
    with pytest.raises(Exception, match="Could not override 'stepz'"):
        compose_config(medusa.TrainConfig, "medusa", ["stepz=3"])
    with pytest.raises(Exception, match="full_key: steps"):
        compose_config(medusa.TrainConfig, "medusa", ["steps=many"])
    with pytest.raises(ValueError, match="labels must be 'corpus', 'argmax' or 'greedy'"):
        compose_config(medusa.TrainConfig, "medusa", ["labels=teacher"])
    with pytest.raises(ValueError, match="workdir: missing; give workdir="):
        compose_config(zoo.TrainConfig, "draft", ["out=x"])
    with pytest.raises(SystemExit):
        zoo_main(["train", "workdir=w", "--out", "x"])  # one form or the other


def test_the_zoo_trainer_takes_overrides(monkeypatch):
    seen = []
    monkeypatch.setattr(zoo, "train", lambda cfg: seen.append(cfg) or zoo.TrainState())
    zoo_main(["train", "workdir=w", "out=o", "steps=3", "minutes=1.5"])
    zoo_main(["train", "--kind", "draft", "--workdir", "w", "--out", "o", "--steps", "3", "--max-minutes", "1.5"])
    assert seen[0] == seen[1] == zoo.TrainConfig(kind="draft", workdir="w", out="o", steps=3, minutes=1.5)
