"""The optional torch.compile of the lean forward's rope: the eager path whenever compiling or running it fails,
never for other dtypes than float32, and (slow: a real inductor build) the same logits bit for bit."""

from __future__ import annotations

import logging

import pytest
import torch

from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime.compiled import Compiled
from specfamily.testing import tiny_model


def _passes(target: Target) -> list[torch.Tensor]:
    """A prefill, a tree whose commit rewrites the cache, a chain and a decode step: each pass's logits."""
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, 8, (n,), generator=gen)  # noqa: E731
    steps = [(ids(7), None, []), (ids(1), Draft(ids(4), torch.tensor([-1, -1, 0, 1])), [1, 3]),
             (ids(1), Draft.chain(ids(3)), [0]), (ids(1), None, [])]
    out = []
    for pending, draft, accepted in steps:
        out.append(target.forward(pending, draft).logits)
        target.commit(accepted)
    return out


def _model(dtype=torch.float32):
    return tiny_model("llama", dtype=dtype)


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("where", ["compile", "run"])
def test_a_failing_compiler_falls_back_to_the_eager_rope(where, monkeypatch, caplog):
    model = _model()
    eager = _passes(Target(model))

    def broken(fn, **options):
        if where == "compile":
            raise RuntimeError("no C++ compiler found")
        def run(*args):
            raise RuntimeError("InductorError: compilation failed")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    target = Target(model, compile=True)
    assert target.lean is not None and target.lean.rotate is not None and target.lean.rotate.active
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.compiled"):
        _assert_same(_passes(target), eager)
    rotate = target.lean.rotate
    assert not rotate.active and rotate.calls == 0 and "RuntimeError" in rotate.reason
    assert len([r for r in caplog.records if "eagerly" in r.getMessage()]) == 1  # warned once, not per layer


def test_other_dtypes_than_float32_never_compile(monkeypatch):
    model = _model(torch.bfloat16)
    eager = _passes(Target(model))
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: asked.append(fn) or fn)
    target = Target(model, compile=True)
    _assert_same(_passes(target), eager)
    assert asked == [] and target.lean.rotate.active and target.lean.rotate.calls == 0


def test_compile_is_off_by_default():
    assert Target(_model()).lean.rotate is None


def test_compiled_wraps_any_function_and_counts_its_calls(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **options: fn)
    wrapped = Compiled(lambda a, b: (a + b,))
    x = torch.ones(2)
    assert torch.equal(wrapped(x, x)[0], 2 * x) and wrapped.calls == 1 and wrapped.active


@pytest.mark.slow
def test_the_compiled_rope_gives_the_eager_logits_bit_for_bit():
    """A real inductor build (a C++ compiler, a minute or more on 2 cores)."""
    model = _model(torch.float32)
    target = Target(model, compile=True)
    _assert_same(_passes(target), _passes(Target(model)))
    assert target.lean.rotate.active and target.lean.rotate.calls > 0, target.lean.rotate.reason
