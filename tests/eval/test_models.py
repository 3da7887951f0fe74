"""specfamily.eval.models: what a ``model`` config node passes on to ``load_target``."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

import specfamily.core.target as target_module
from specfamily.eval.models import load_model_target


def _passed(monkeypatch, **node) -> dict:
    seen = {}
    monkeypatch.setattr(target_module, "load_target", lambda name, **kwargs: seen.update(name=name, **kwargs))
    load_model_target(OmegaConf.create({"target": "zoo:code-target", **node}), torch.device("cpu"))
    return seen


def test_the_compile_option_reaches_the_target(monkeypatch):
    assert _passed(monkeypatch, compile="pass", matmul="stream")["compile"] == "pass"
    assert _passed(monkeypatch, compile="rope")["compile"] == "rope"
    defaults = _passed(monkeypatch)
    assert (defaults["compile"], defaults["matmul"], defaults["name"]) == (False, "exact", "zoo:code-target")
    assert _passed(monkeypatch, compile=False)["compile"] is False
