"""The rope table: per-pass rows bit-identical to the rope computed per pass (the lean forward's use: test_lean.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specfamily.runtime.lean import rope
from specfamily.runtime.rope_table import TABLE_MIN, RopeTable


def _rotary(head_dim: int, **rope_parameters) -> LlamaRotaryEmbedding:
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=4096,
                         **({"rope_parameters": {"rope_theta": 10000.0, **rope_parameters}} if rope_parameters else {}))
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 64])
def test_table_rows_equal_the_rope_of_each_pass_bit_for_bit(head_dim, dtype):
    rotary, table = _rotary(head_dim), RopeTable(rope)
    hidden = torch.zeros(1, 5, 8, dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    for start in (0, 3, 200, 255, 256, 700, 1500):  # across the first table and two growths
        for q in (1, 5, 9):
            positions = torch.arange(start, start + q)[None]
            if q == 9:  # a tree's positions: repeated depths
                positions = start + torch.tensor([[0, 1, 1, 2, 2, 3, 3, 3, 4]])
            cos, sin = table(rotary, hidden, positions)
            want_cos, want_sin = rope(rotary, hidden, positions)
            assert cos.shape == want_cos.shape == (1, 1, q, head_dim) and cos.dtype == dtype
            assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    every = torch.randint(0, table.cos.shape[0], (1, 64), generator=generator)
    assert torch.equal(table(rotary, hidden, every)[1], rope(rotary, hidden, every)[1])
    assert table.cos.shape[0] >= 1509 > TABLE_MIN  # it grew past the first table: the growths were exercised


def test_the_table_falls_back_where_it_cannot_match():
    table, hidden = RopeTable(rope), torch.zeros(2, 3, 8)
    rotary = _rotary(16)
    batched = torch.tensor([[4, 5, 6], [7, 8, 9]])  # batch 2
    got, want = table(rotary, hidden, batched), rope(rotary, hidden, batched)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert table.cos is None  # computed per call, no table
    odd = _rotary(24)  # 24 values a row: a row's tail falls outside the kernels' vectorised body
    positions = torch.arange(3)[None]
    assert torch.equal(table(odd, hidden[:1], positions)[0], rope(odd, hidden[:1], positions)[0])
    assert table.cos is None


def test_the_table_follows_a_changed_rotary():
    rotary, table, hidden = _rotary(16), RopeTable(rope), torch.zeros(1, 2, 8)
    positions = torch.tensor([[10, 11]])
    with torch.inference_mode():
        table(rotary, hidden, positions)
    with torch.no_grad():
        rotary.inv_freq.mul_(0.5)  # changed in place: the table is rebuilt
    assert torch.equal(table(rotary, hidden, positions)[0], rope(rotary, hidden, positions)[0])
    other = _rotary(16, rope_type="linear", factor=2.0)  # another module: its own frequencies
    assert torch.equal(table(other, hidden, positions)[1], rope(other, hidden, positions)[1])
    assert table.key[0] == id(other.inv_freq)
