"""ModuleWatch keeps a clean verdict on the hook tables between hook registrations (issue 32): every change it
guards against still shows after a cached clean verdict, and the cached verdict is what a later call reads."""

from __future__ import annotations

import pytest
import torch

from specfamily.core.target import Target
from specfamily.runtime import lean
from specfamily.testing import tiny_model


def _target() -> Target:
    return Target(tiny_model(dtype=torch.float32).eval())


def _forward_hook(module):
    return module.register_forward_hook(lambda *args: None)


def _kwargs_hook(module):
    return module.register_forward_hook(lambda *args: None, with_kwargs=True)


def _pre_hook(module):
    return module.register_forward_pre_hook(lambda *args: None)


def _global_hook(module):
    return torch.nn.modules.module.register_module_forward_hook(lambda *args: None)


class _Undo:
    def __init__(self, module, name: str) -> None:
        self.module, self.name = module, name

    def remove(self) -> None:
        delattr(self.module, self.name)


def _replaced_forward(module):
    module.forward = module.forward
    return _Undo(module, "forward")


def _accelerate_hook(module):
    module._hf_hook = object()
    return _Undo(module, "_hf_hook")


CHANGES = [_forward_hook, _kwargs_hook, _pre_hook, _global_hook, _replaced_forward, _accelerate_hook]


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.__name__.strip("_"))
@pytest.mark.parametrize("where", ["embed", "mlp", "head"])
def test_a_change_after_a_cached_clean_verdict_still_shows(change, where):
    target = _target()
    model = target.model
    module = {"embed": model.model.embed_tokens, "mlp": model.model.layers[1].mlp, "head": model.lm_head}[where]
    assert target.lean.ready() and target.lean.ready()  # the second call reads the kept verdict
    undo = change(module)
    try:
        assert not target.lean.ready()
        assert not target.lean.ready()  # a hooked verdict is not kept
    finally:
        undo.remove()
    assert target.lean.ready()


def test_a_kept_clean_verdict_skips_the_hook_tables(monkeypatch):
    target = _target()
    read = []
    monkeypatch.setattr(lean, "blocking", lambda hooks: read.append(hooks) or False)  # every hook passes
    handle = _forward_hook(target.model.lm_head)
    try:
        assert target.lean.ready()
        assert read  # a new handle: the tables were read
        read.clear()
        assert target.lean.ready()
        assert read == []  # no hook handle since: the kept verdict, the tables not read again
        _forward_hook(target.model.lm_head).remove()  # a new handle, even one removed, reads the tables again
        assert target.lean.ready()
        assert read
    finally:
        handle.remove()
