"""The packed pass: a ragged batch's products on its fed rows only, the same logits and features as the padded pass
(bit for bit under the batch-invariant stream kernel), and only the fed rows computed."""

import pytest
import torch
import torch.nn.functional as F

import specfamily as sf
from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.types import Draft
from specfamily.runtime import kernel
from specfamily.runtime.batch_lean import packed_forward
from specfamily.testing import tiny_target

PROMPTS = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
DRAFTS = [Draft(torch.tensor([3, 4, 5, 6]), torch.tensor([-1, -1, 0, 2])), Draft.empty(), Draft.chain([11, 12])]


def _passes(target, packed: bool, monkeypatch, features):
    """Prefill (ragged prompts) then one ragged pass of drafts; each pass's outputs and rows computed."""
    if not packed:
        monkeypatch.setattr(BatchTarget, "_packs", lambda self, *a: False)
    batch = BatchTarget(target, slots=3, capacity=16)
    first = batch.forward(0, [SlotFeed(torch.tensor(p), Draft.empty()) for p in PROMPTS], features=features)
    rows = [batch.rows]
    for slot in range(3):
        batch.commit(slot, [])
    second = batch.forward(0, [SlotFeed(torch.tensor([p[-1]]), d) for p, d in zip(PROMPTS, DRAFTS, strict=True)],
                           features=features)
    rows.append(batch.rows)
    monkeypatch.undo()
    return first + second, rows


@pytest.mark.parametrize("features", [True, (0, 2)])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_packed_passes_score_as_the_padded_ones(monkeypatch, family, features):
    target = tiny_target(family, vocab_size=32, spread=1.0)  # float64
    assert target.lean is not None and target.lean.ready()
    packed, packed_rows = _passes(target, True, monkeypatch, features)
    padded, padded_rows = _passes(target, False, monkeypatch, features)
    assert packed_rows == [5 + 2 + 3, 5 + 1 + 3] and padded_rows == [3 * 5, 3 * 5]
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(a.features, b.features, rtol=0, atol=1e-12)


def _sdpa_ignores_masked_keys(heads: int, head_dim: int, keys: int) -> bool:
    """Whether this machine's sdpa gives a slot's rows over its own keys the bits it gives them over the padded
    layout's ``keys`` keys, the rest masked: the packed pass attends each slot alone, the padded one over the padded
    layout. torch 2.13's CPU kernel does on some CPUs and not on others (an AMD EPYC with AVX-512, session 36: last
    bits ~1e-7 apart for most shapes, under every ``ATEN_CPU_CAPABILITY``)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=generator) for n in (2, keys, keys))
    mask = torch.full((1, 1, 2, keys), torch.finfo(torch.float32).min)
    mask[0, 0, :, :2] = torch.tensor([[0.0, torch.finfo(torch.float32).min], [0.0, 0.0]])
    own = F.scaled_dot_product_attention(q, k[:, :, :2], v[:, :, :2], attn_mask=mask[..., :2])
    return torch.equal(own, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_under_the_stream_kernel_packed_logits_are_bit_identical(monkeypatch):
    """Bit for bit where sdpa ignores masked keys exactly (the products are batch-invariant under ``stream``); where
    it does not, within float32's rounding of the attention (a misplaced row would be off by far more)."""
    built = kernel.stream_kernel()
    if not built.available:
        pytest.skip(f"stream kernel unavailable: {built.reason}")
    model = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float32).model
    target = sf.load_target(model, matmul="stream")
    packed, _ = _passes(target, True, monkeypatch, True)
    padded, _ = _passes(target, False, monkeypatch, True)
    config = model.config
    exact = _sdpa_ignores_masked_keys(config.num_attention_heads, config.hidden_size // config.num_attention_heads, 16)
    for a, b in zip(packed, padded, strict=True):
        if exact:
            assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
        else:
            torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-6)
            torch.testing.assert_close(a.features, b.features, rtol=0, atol=1e-5)


def test_a_pass_without_padding_is_refused():
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"a packed pass needs several slots of several rows, got \(1, 3\)"):
        packed_forward(target.lean, ids, ids, None, None, torch.arange(3), torch.arange(3))


def test_each_slot_attends_its_own_rows_over_its_own_keys(monkeypatch):
    """A long prompt beside short rows: each slot's sdpa takes only its fed rows as queries and only its own
    cached-plus-fed keys (no padded queries, no keys past its own), and the logits are the padded pass's."""
    from specfamily.runtime import batch_lean

    target = tiny_target("llama", vocab_size=32, spread=1.0)  # float64
    shapes, sdpa = [], batch_lean.F.scaled_dot_product_attention

    def recording(query, key, value, **kwargs):
        shapes.append((query.shape[0], query.shape[2], key.shape[2]))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(batch_lean.F, "scaled_dot_product_attention", recording)
    packed, _ = _passes(target, True, monkeypatch, True)
    layers = target.model.config.num_hidden_layers
    # prefill: the prompts' own lengths over their own keys; then roots plus drafts over cached + fed
    assert shapes[:3] == [(1, 5, 5), (1, 2, 2), (1, 3, 3)]
    assert shapes[3 * layers : 3 * layers + 3] == [(1, 5, 10), (1, 1, 3), (1, 3, 6)]
    assert len(shapes) == 6 * layers
    padded, _ = _passes(target, False, monkeypatch, True)
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-12)
