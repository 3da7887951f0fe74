"""The int8 weight-only product (specfamily.runtime.int8_matmul, csrc/int8/int8_linear.cpp)."""

import logging

import pytest
import torch
import torch.nn.functional as F

from specfamily.runtime.int8_matmul import (
    DISABLE_ENV,
    PANEL,
    Int8Weight,
    dequantize,
    int8_kernel,
    pack_int8,
    quantize_rows,
)

needs_kernel = pytest.mark.skipif(not int8_kernel().available, reason=f"int8 kernel not built: {int8_kernel().reason}")
TOLERANCE = {"vnni": 2e-4}  # relative to the largest output: VNNI rounds the activations to 16 bits; others 1e-5
SHAPES = [(37, 24), (100, 37), (16, 64), (5, 8), (49, 1), (1, 13)]  # (n, d): n past a panel, d not a multiple of 8


def _case(n: int, d: int, rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(n, d, generator=gen), torch.randn(n, generator=gen)
    return weight, bias, torch.randn(rows, d, generator=gen)


def test_rows_are_quantized_per_output_row_symmetrically():
    weight = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [254.0, 127.0, -1.0]])
    q, scales = quantize_rows(weight)
    assert q.dtype == torch.int8 and torch.equal(scales, torch.tensor([2.0 / 127, 1.0, 2.0]))
    assert torch.equal(q, torch.tensor([[64, -127, 32], [0, 0, 0], [127, 64, 0]], dtype=torch.int8))
    assert (dequantize(q, scales) - weight).abs().max() <= scales.max() / 2


def test_packing_puts_16_output_rows_input_major_and_pads_with_zeros():
    q = torch.arange(20 * 3, dtype=torch.int8).view(20, 3)
    packed = pack_int8(q)
    assert packed.shape == (2, 3, PANEL) and packed.dtype == torch.int8
    assert torch.equal(packed[0], q[:16].t()) and torch.equal(packed[1, :, :4], q[16:].t())
    assert not packed[1, :, 4:].any()


@needs_kernel
@pytest.mark.parametrize("n,d", SHAPES)
def test_the_product_is_the_dequantized_weights_product_for_1_to_17_rows(n, d):
    weight, bias, x = _case(n, d, 17)
    product = Int8Weight.of(weight, bias)
    reference = F.linear(x.double(), product.weight().double(), bias.double())
    for isa in int8_kernel().module.supported_isas():
        for rows in range(1, 18):
            y = product(x[:rows], isa)
            assert y.shape == (rows, n) and y.dtype == torch.float32
            tolerance = TOLERANCE.get(isa, 1e-5) * reference[:rows].abs().max().item()
            assert (y.double() - reference[:rows]).abs().max().item() <= tolerance, (isa, rows)


@needs_kernel
def test_vector_paths_match_the_scalar_loop_and_a_row_does_not_depend_on_its_batch():
    weight, bias, x = _case(203, 77, 16, seed=1)
    product = Int8Weight.of(weight, bias)
    isas = int8_kernel().module.supported_isas()
    assert isas[-1] == "scalar" and int8_kernel().isa == isas[0]
    both = isas[:2] == ["avx2", "avx512"]
    assert [int8_kernel().module.isa_for(k) for k in (1, 2, 3, 16)] == (["avx512"] * 2 + ["avx2"] * 2 if both
                                                                        else [isas[0]] * 4)
    scalar = product(x, "scalar")
    for isa in isas:
        full = product(x, isa)
        assert (full - scalar).abs().max() <= TOLERANCE.get(isa, 1e-5) * scalar.abs().max(), isa
        assert all(torch.equal(product(x[j : j + 1], isa)[0], full[j]) for j in range(16))  # batch-invariant


@needs_kernel
def test_leading_dimensions_no_bias_and_a_large_shape():
    weight, _, x = _case(1536, 576, 6, seed=2)
    product = Int8Weight.of(weight)
    y = product(x.view(2, 3, 576))
    assert y.shape == (2, 3, 1536) and product.bias is None
    torch.testing.assert_close(y.view(6, 1536).double(), F.linear(x.double(), product.weight().double()),
                               rtol=1e-5, atol=1e-4)
    assert product.nbytes == 1536 * 576 + 1536 * 4  # a quarter of the float weight's bytes, and the scales
    assert (product.weight() - weight).abs().max() <= weight.abs().max() / 127 / 2 + 1e-6


@needs_kernel
def test_bad_inputs_are_refused_by_name():
    weight, bias, x = _case(20, 8, 2)
    product = Int8Weight.of(weight, bias)
    with pytest.raises(RuntimeError, match="int8_linear: x must be float32 on the CPU with 8 features last"):
        product(x.double())
    with pytest.raises(RuntimeError, match="int8_linear: x must be float32 on the CPU with 8 features last"):
        product(torch.randn(2, 9))
    with pytest.raises(RuntimeError, match="instruction set 'neon' is not supported on this CPU"):
        product(x, "neon")


def test_a_failed_build_warns_once_and_names_why(int8_unbuilt, caplog):
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.int8_matmul"):
        first, second = int8_kernel(), int8_kernel()
    assert first is second and not first.available and first.isa is None
    assert first.reason == "RuntimeError: Error building extension 'specfamily_int8_linear'"
    assert [r.getMessage() for r in caplog.records] == [
        "int8 weight-only kernel unavailable (RuntimeError: Error building extension 'specfamily_int8_linear'): "
        "quantize=8 uses torch.ao's dynamic int8"]
    with pytest.raises(RuntimeError, match="the int8 weight-only kernel is not available here: RuntimeError"):
        Int8Weight.of(torch.ones(2, 2))(torch.ones(1, 2))


def test_the_disable_switch_is_a_reason(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    int8_kernel.cache_clear()
    try:
        assert int8_kernel().reason == f"KernelUnavailable: {DISABLE_ENV} is set"
    finally:
        int8_kernel.cache_clear()
