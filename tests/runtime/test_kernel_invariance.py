"""The stream kernel's two promises beyond F.linear's values (issue 30): a row's result is bit-identical whatever
rows it is multiplied with (every row count, every instruction set, no BLAS past some count), and its packed copy
of a weight follows writes made through ``.data`` (which move a version counter of their own, not the weight's).

The fallback when the kernel cannot build is ``exact``/``skinny`` (BLAS): not batch-invariant, and said so.
Where the kernel cannot build, the kernel tests skip (test_kernel.py's rule) and the fallback test still runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specfamily.runtime import kernel, matmul
from specfamily.runtime.attention import attention_source
from specfamily.runtime.int8_matmul import int8_source
from specfamily.runtime.kernel import KernelUnavailable
from specfamily.runtime.native_layers import native_source

# every block size the instruction sets' loops choose among (1-16 rows: the panels taken at once, the fetch distance,
# the weight lines held in registers change with it; 9-16 rows on AVX-512 as two blocks taking turns over spans of
# 64 inputs), then the blocks of 16 and what is left past them
ROW_COUNTS = (*range(1, 18), 63, 64, 65, 100, 200)
# (out, in): padded panels, odd widths, one panel, one input, spans of inputs with a short last one (64, 64, 22)
SHAPES = [(130, 576), (37, 33), (200, 40), (16, 1), (70, 150)]


def _rows_alone(module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, isa: str) -> torch.Tensor:
    """Each row of ``x`` multiplied on its own."""
    return torch.cat([module.linear_with(x[i : i + 1], weight, bias, isa) for i in range(x.shape[0])])


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(module, isa, shape):
    if isa not in module.supported_isas():
        pytest.skip(f"this CPU does not run {isa}")
    out_features, in_features = shape
    gen = torch.Generator().manual_seed(out_features + in_features)
    weight, bias = torch.randn(out_features, in_features, generator=gen), torch.randn(out_features, generator=gen)
    for rows in ROW_COUNTS:
        x = torch.randn(rows, in_features, generator=gen)
        for b in (None, bias):
            together = module.linear_with(x, weight, b, isa)
            alone = _rows_alone(module, x, weight, b, isa)
            differ = (together != alone).any(dim=1).nonzero().flatten().tolist()
            assert not differ, f"{rows} rows on {isa}: rows {differ[:8]} differ from the same rows alone"
            tail = module.linear_with(x[rows // 2 :], weight, b, isa)  # the same rows at other places in a batch
            assert torch.equal(tail, together[rows // 2 :])
            torch.testing.assert_close(together, F.linear(x, weight, b), rtol=1e-5, atol=1e-5 * in_features**0.5)


def test_a_prefill_sized_pass_through_the_python_entry_points_is_batch_invariant(module):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(300, 576, generator=gen)  # SmolLM2's width: BLAS then sums in another order than the kernel
    hidden = torch.randn(150, 576, generator=gen)  # a prompt of 150 tokens, or a tree of 150 nodes
    with torch.no_grad():
        together = matmul.head_product(hidden, weight, None, module.linear)
        assert torch.equal(together, matmul.stream_linear(hidden, weight))
        assert torch.equal(together[100:], module.linear(hidden[100:], weight))
        assert torch.equal(together[149:], module.linear(hidden[149], weight)[None])


def _layer(seed: int) -> tuple[torch.nn.Linear, torch.Tensor, torch.Generator]:
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(48, 70)
    return layer, torch.randn(5, 48, generator=gen), gen


def _equals_f_linear(module, x: torch.Tensor, layer: torch.nn.Linear) -> None:
    torch.testing.assert_close(
        module.linear(x, layer.weight, layer.bias), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-4
    )


@torch.no_grad()
def test_a_copy_into_data_is_seen(module):
    layer, x, gen = _layer(11)
    _equals_f_linear(module, x, layer)  # packed
    version = layer.weight._version
    layer.weight.data.copy_(torch.randn(70, 48, generator=gen))  # new weights, in place, past the version counter
    assert layer.weight._version == version
    _equals_f_linear(module, x, layer)
    layer.weight.data.mul_(-0.5)
    _equals_f_linear(module, x, layer)


@torch.no_grad()
def test_rebinding_data_and_writing_through_the_bound_tensor_is_seen(module):
    layer, x, gen = _layer(12)
    _equals_f_linear(module, x, layer)
    fresh = torch.randn(70, 48, generator=gen)
    layer.weight.data = fresh  # new storage
    _equals_f_linear(module, x, layer)
    version = layer.weight._version
    fresh.copy_(torch.randn(70, 48, generator=gen))  # the same storage, written through the tensor bound to .data
    assert layer.weight._version == version and layer.weight.data_ptr() == fresh.data_ptr()
    _equals_f_linear(module, x, layer)
    layer.weight.data = fresh.t().contiguous().t()  # the same values in another layout: packed again, still right
    _equals_f_linear(module, x, layer)


@torch.no_grad()
def test_an_unchanged_weight_keeps_its_packed_copy_and_drop_packed_forgets_it(module):
    layer, x, _ = _layer(13)
    module.linear(x, layer.weight, layer.bias)
    packed = kernel._packed(layer.weight)
    for _ in range(3):
        module.linear(x, layer.weight, layer.bias)
        assert kernel._packed(layer.weight) is packed  # the sampled elements agree: not remade
    layer.weight.data[3, 5] += 1.0  # one element: whether the samples see it or not, drop_packed makes it right
    kernel.drop_packed([layer.weight])
    _equals_f_linear(module, x, layer)


def test_the_fallback_is_said_not_to_be_batch_invariant(monkeypatch):
    def fail(verbose: bool = False):
        raise KernelUnavailable("no C++ compiler ('c++' is not on PATH)")

    monkeypatch.setattr(kernel, "build_kernel", fail)
    kernel.stream_kernel.cache_clear()
    try:
        monkeypatch.setattr(matmul, "kind_seconds", lambda weights, kinds: {"exact": 1.0, "skinny": 0.5})
        choice = matmul.choose_matmul("stream", torch.nn.Sequential(torch.nn.Linear(8, 8)))
    finally:
        kernel.stream_kernel.cache_clear()
    assert choice.kind == "skinny" and not choice.batch_invariant
    assert "not batch-invariant" in choice.note
    assert matmul.MatmulChoice("stream", "stream").batch_invariant
    assert matmul.BATCH_INVARIANT_KINDS == ("stream",)


def test_a_change_to_any_source_file_builds_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path / "cache"))
    sources = kernel.kernel_sources()
    assert sources[0] == kernel.kernel_source() and {p.name for p in sources} >= {"stream_linear.cpp", "rms_norm.cpp"}
    copies = tmp_path / "csrc"
    copies.mkdir()
    headers = sorted(kernel.kernel_source().parent.glob("*.h"))
    assert {p.name for p in headers} >= {"cpu_isa.h", "stream_pack.h"}
    for path in [*sources, *headers]:
        (copies / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    main = copies / kernel.kernel_source().name
    first = kernel.build_folder(main)
    # keyed on where the sources lie too: the build's ninja file names them by absolute path
    assert first != kernel.build_folder(kernel.kernel_source()) and first == kernel.build_folder(main)
    for path in sorted([*copies.glob("*.cpp"), *copies.glob("*.h")]):
        path.write_text(path.read_text(encoding="utf-8") + "\n// changed\n", encoding="utf-8")
        assert kernel.build_folder(main) != first, f"a change to {path.name} would reuse the old build"
        first = kernel.build_folder(main)


def quoted_includes(path: Path) -> set[Path]:
    """Every file ``path`` includes with quotes, and those they include."""
    found = set()
    for name in re.findall(r'^#include "([^"]+)"', path.read_text(encoding="utf-8"), flags=re.MULTILINE):
        included = (path.parent / name).resolve()
        found |= {included, *quoted_includes(included)}
    return found


@pytest.mark.parametrize("source", [*kernel.kernel_sources(), attention_source(), int8_source(), native_source()],
                         ids=lambda p: p.name)
def test_every_header_a_kernel_includes_is_in_its_build_key(source):
    assert quoted_includes(source) <= {p.resolve() for p in kernel.kernel_headers(source)}


def test_the_three_kernels_detect_instruction_sets_in_one_header():
    shared = (kernel.kernel_source().parent / "cpu_isa.h").resolve()
    for source in (kernel.kernel_source(), attention_source(), int8_source()):
        assert shared in quoted_includes(source), source.name
        assert "__builtin_cpu_supports" not in source.read_text(encoding="utf-8"), source.name


def test_a_kernels_missing_file_is_named_before_any_build(tmp_path):
    """``kernel.build_source`` checks the source and every header it includes before it compiles anything."""
    source = tmp_path / "toy.cpp"
    with pytest.raises(kernel.KernelUnavailable, match=re.escape(
            f"the toy kernel's file {source} is missing from the installed package")):
        kernel.build_source("toy", source, "toy", "toy kernel")
    source.write_text("// a source whose header is gone\n")
    with pytest.raises(kernel.KernelUnavailable, match=re.escape(
            f"the toy kernel's file {tmp_path / 'toy.h'} is missing from the installed package")):
        kernel.build_source("toy", source, "toy", "toy kernel", headers=("toy.h",))
