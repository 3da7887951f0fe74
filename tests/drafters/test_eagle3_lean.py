"""The lean EAGLE-3 layer: outputs and cache bit-identical to Eagle3Model.forward (F.linear), within float32 rounding
under the stream kernel's kind; the drafter takes it and still reproduces the target's greedy text."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specfamily.core.tree_mask import additive, attention_mask, local_mask
from specfamily.drafters.eagle.drafter import Eagle3Drafter
from specfamily.drafters.eagle.lean import LeanEagle3Layer, lean_eagle3_unsupported
from specfamily.drafters.eagle.model3 import Eagle3Model, Eagle3Shape, build_model, draft_layer_config
from specfamily.drafters.shared.feature_drafting import crop
from specfamily.testing import tiny_model
from specfamily.testing.conformance import assert_greedy_equivalent
from specfamily.testing.tiny import single_thread

VOCAB = 64
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


def _eagle3(dtype=torch.float32, kv_heads: int = 1, before_residual: bool = False) -> Eagle3Model:
    """A random EAGLE-3 over a tiny 4-layer target (hidden 32, 2 query heads), norm weights moved off one."""
    target = tiny_model("llama", VOCAB, dtype=dtype, layers=4, kv_heads=kv_heads)
    shape = Eagle3Shape(draft_layer_config(target), (0, 2, 4), norm_before_residual=before_residual)
    model = build_model(target, shape, None, seed=1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model.to(dtype)


def _calls(dtype, hidden: int, gen: torch.Generator):
    """(tokens, hidden, positions, mask, crop_to): a catch-up, single queries, a tree depth, a masked single node."""
    ids = lambda n: torch.randint(0, VOCAB, (1, n), generator=gen)  # noqa: E731
    feats = lambda n: torch.randn(1, n, hidden, generator=gen).to(dtype)  # noqa: E731
    tree = torch.zeros(1, 1, 3, 9, dtype=dtype)
    tree[0, 0, :, 6:] = additive(torch.eye(3, dtype=torch.bool), dtype)
    one = torch.zeros(1, 1, 1, 8, dtype=dtype)
    one[0, 0, :, 6:] = additive(torch.tensor([[True, False]]), dtype)
    return [
        (ids(5), feats(5), torch.arange(5)[None], attention_mask(0, local_mask(5, [], dtype)), None),
        (ids(1), feats(1), torch.tensor([[5]]), None, None),
        (ids(3), feats(3), torch.full((1, 3), 6), tree, 6),  # three children of the root, each seeing itself
        (ids(1), feats(1), torch.tensor([[7]]), one, 7),  # one node under a mask: the packed branch
    ]


@DTYPES
@pytest.mark.parametrize("kv_heads, before_residual", [(1, False), (2, False), (1, True)],
                         ids=["gqa", "mha", "norm-before-residual"])
def test_lean_layer_equals_the_module_bit_for_bit(dtype, kv_heads, before_residual):
    model = _eagle3(dtype, kv_heads, before_residual)
    lean = LeanEagle3Layer(model)
    module_cache, lean_cache = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        assert lean.ready()
        for tokens, hidden, positions, mask, crop_to in _calls(dtype, model.hidden_size, torch.Generator()):
            if crop_to is not None:
                crop(module_cache, crop_to)
                crop(lean_cache, crop_to)
            expected = model(tokens, hidden, positions, mask, module_cache)
            got = lean(tokens, hidden, positions, mask, lean_cache)
            assert got.dtype == dtype and torch.equal(got, expected)
            x, y = lean_cache.layers[0], module_cache.layers[0]
            assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)


def test_under_the_stream_kind_within_float32_rounding():
    from specfamily.runtime.kernel import stream_kernel
    from specfamily.runtime.matmul import linear_for

    if stream_kernel().module is None:
        pytest.skip(f"the stream kernel is not available here: {stream_kernel().reason}")
    model = _eagle3()
    lean = LeanEagle3Layer(model, linear_for("stream"))
    module_cache, lean_cache = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        for tokens, hidden, positions, mask, crop_to in _calls(torch.float32, model.hidden_size, torch.Generator()):
            if crop_to is not None:
                crop(module_cache, crop_to)
                crop(lean_cache, crop_to)
            torch.testing.assert_close(lean(tokens, hidden, positions, mask, lean_cache),
                                       model(tokens, hidden, positions, mask, module_cache), rtol=1e-5, atol=1e-5)


def test_not_ready_while_training_or_with_gradients_and_refused_with_hooks():
    model = _eagle3()
    lean = LeanEagle3Layer(model)
    assert lean.ready() is False  # gradients are enabled outside inference mode
    with torch.inference_mode():
        assert lean.ready()
        model.train()
        assert not lean.ready()
        model.eval()
        model.midlayer.mlp.register_forward_hook(lambda *args: None)
        assert not lean.ready()
    model.fc.register_forward_pre_hook(lambda *args: None)
    assert lean_eagle3_unsupported(model) == "a module has hooks or a replaced forward (Linear)"
    with pytest.raises(ValueError, match=r"the lean eagle3 layer cannot run this model: a module has hooks"):
        LeanEagle3Layer(model)


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_the_drafter_drafts_through_the_lean_layer_and_keeps_greedy_text(mode, monkeypatch):
    calls = []
    original = LeanEagle3Layer.__call__

    def counted(self, *args):
        calls.append(args[0].shape[1])
        return original(self, *args)

    monkeypatch.setattr(LeanEagle3Layer, "__call__", counted)
    assert_greedy_equivalent(lambda t: Eagle3Drafter(t, weights="random", gamma=3, mode=mode))
    assert 1 in calls and max(calls) > 1  # single drafting steps and batched calls (catch-up, tree depths)
