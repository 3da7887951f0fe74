"""EAGLE and Medusa on the stream kernel pack the weights their drafting multiplies when they are made, so a run's
first proposal packs nothing (docs/batching-log.md, session 29: 0.1 s of a B=4 eagle run's CPU, 2-3 plain passes)."""

import os

import pytest
from torch import nn

import specfamily as sf
from specfamily.runtime import kernel


@pytest.fixture
def stream_target():  # a fresh one: no pass has packed its head yet (a Medusa with a shared head multiplies by it)
    built = kernel.stream_kernel()
    if not built.available:
        if os.environ.get("SPECFAMILY_REQUIRE_KERNEL"):
            pytest.fail(f"the stream kernel must build here: {built.reason}")
        pytest.skip(f"stream kernel unavailable: {built.reason}")
    return sf.load_target("zoo:code-target", matmul="stream")


def _multiplied(drafter, target) -> list:
    """The weights the drafting multiplies with the target's product: Medusa's shared projection (the target's head
    here; the heads' blocks run as modules), EAGLE's own fc, layer projections and draft-vocabulary head rows."""
    if hasattr(drafter, "heads"):
        return [drafter.heads.lm_head.weight]
    model, shared = drafter.model, {id(p) for p in target.model.parameters()}
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)] + [model.head_weight]
    return [w for w in weights if w is not None and id(w) not in shared]


@pytest.mark.parametrize(("name", "options"), [("eagle", {}), ("medusa", {"weights": "random", "share_lm_head": True})])
def test_a_drafter_packs_its_weights_when_made_and_its_runs_pack_none(name, options, stream_target, monkeypatch):
    drafter = sf.create_drafter(name, stream_target, **options)
    weights = _multiplied(drafter, stream_target)
    packed = [kernel._packed(w) for w in weights]
    assert weights and all(p is not None for p in packed)
    prompts = [stream_target.tokenizer(t)["input_ids"] for t in ("def add(a, b):\n    return", "for i in range(10):")]
    drafts = []
    own = type(drafter).propose_batch

    def spy(self, drafters, ctxs, gammas):
        out = own(self, drafters, ctxs, gammas)
        drafts.extend(len(d) for d in out)
        return out

    monkeypatch.setattr(type(drafter), "propose_batch", spy)
    results = sf.generate_batch(stream_target, drafter, prompts, max_new_tokens=12)
    plain = sf.generate_batch(stream_target, None, prompts, max_new_tokens=12)
    assert [r.tokens for r in results] == [r.tokens for r in plain]
    assert sum(drafts) > 0  # it drafted: its products ran
    assert all(kernel._packed(w) is p for w, p in zip(weights, packed, strict=True))  # the same copies: none anew
