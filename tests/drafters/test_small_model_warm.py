"""A small_model drafter makes its draft model's first forward when it is built, not inside a request's first draft
(a fresh draft model's first forward costs ~60 ms more than the next one: docs/policy-costs.md, session 25)."""

import torch

import specfamily as sf
from specfamily.core.target import Target
from specfamily.testing import tiny_model, tiny_target


def test_the_draft_model_runs_once_when_built_and_starts_requests_empty(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    draft = tiny_model("llama", 64, seed=7, dtype=torch.float32, spread=1.0, layers=1)
    calls = []
    forward = Target.forward

    def counted(self, *args, **kwargs):
        calls.append(self)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Target, "forward", counted)
    drafter = sf.create_drafter("small_model", target, model=draft, gamma=3)
    assert calls == [drafter.runner] and drafter.runner.cached_length == 0
    monkeypatch.setattr(Target, "forward", forward)
    plain = sf.generate(target, None, [1, 2, 3], max_new_tokens=24).tokens
    assert sf.generate(target, drafter, [1, 2, 3], max_new_tokens=24).tokens == plain
