"""The compiled whole pass (``Target(compile="pass")``): bucketed padding, the cache written in place, the eager lean
forward wherever it does not apply or the compiler fails; under a real inductor build (slow) no graph break, logits
within float32 rounding of the eager pass and greedy text identical to it, plain and drafted; on CUDA, CUDA graphs.

The default tests replace ``torch.compile`` by the identity: the graph's function then runs eagerly, through the
same padding, buffers, registered stream ops and bookkeeping the compiled graph runs."""

from __future__ import annotations

import logging

import pytest
import torch

import specfamily as sf
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.runtime.compiled_pass import SPAN_STEP, CompiledPass, PassGraph, bucket, padded_inputs
from specfamily.runtime.kernel import stream_kernel
from specfamily.testing import tiny_model
from specfamily.testing.depth import DepthRecorder

VOCAB = 64
needs_kernel = pytest.mark.skipif(not stream_kernel().available, reason=f"no stream kernel: {stream_kernel().reason}")


def _model(**options):
    return tiny_model("llama", vocab_size=VOCAB, dtype=torch.float32, kv_heads=1, **options)


def _steps():
    """A prefill, a tree whose commit rewrites the cache, a chain, decode steps and a chain kept whole."""
    gen = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(0, VOCAB, (n,), generator=gen)  # noqa: E731
    return [(ids(7), None, []), (ids(1), Draft(ids(4), torch.tensor([-1, -1, 0, 1])), [1, 3]),
            (ids(1), Draft.chain(ids(3)), [0]), (ids(1), None, []), (ids(1), None, []),
            (ids(1), Draft.chain(ids(5)), [0, 1, 2, 3, 4])]


def _passes(target: Target) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each pass's logits, and every layer's cached keys after the last commit."""
    logits = []
    for pending, draft, accepted in _steps():
        logits.append(target.forward(pending, draft).logits)
        target.commit(accepted)
    return logits, [layer.keys.clone() for layer in target.cache.layers]


def _close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-5) -> float:
    """The largest difference, after checking shapes and the tolerance."""
    assert [x.shape for x in a] == [y.shape for y in b]
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
    assert worst <= atol, worst
    return worst


@pytest.fixture
def identity_compile(monkeypatch):
    """torch.compile replaced by the identity; the options each call asked for."""
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: asked.append(options) or fn)
    return asked


def test_buckets():
    assert [bucket(q) for q in (1, 2, 3, 5, 8, 9, 33, 64, 65)] == [1, 2, 4, 8, 8, 16, 64, 64, None]
    assert bucket(3, (2, 6)) == 6 and bucket(7, (2, 6)) is None


def test_padding_keeps_the_real_rows_masks_and_hides_the_padding():
    minimum = torch.finfo(torch.float32).min
    mask = torch.tensor([[0.0, 0, 0, minimum], [0, 0, 0, 0]])[None, None]  # 2 rows over 2 cached entries
    ids, positions = torch.tensor([[5, 6]]), torch.tensor([[2, 3]])
    padded = padded_inputs(ids, positions, mask, start=2, rows=4, span=7, dtype=torch.float32)
    assert padded.ids.tolist() == [[5, 6, 6, 6]] and padded.positions.tolist() == [[2, 3, 3, 3]]
    assert padded.slots.tolist() == [2, 3, 4, 5] and padded.mask.shape == (1, 1, 4, 7)
    assert torch.equal(padded.mask[0, 0, :2, :4], mask[0, 0])
    assert (padded.mask[0, 0, :, 4:] == minimum).all()  # no row sees the padding's entries, nor past them
    assert padded.mask[0, 0, 2:].tolist() == [[0.0] + [minimum] * 6] * 2  # padded rows see entry 0 only
    one = padded_inputs(ids[:, :1], positions[:, :1], None, start=2, rows=1, span=3, dtype=torch.float32)
    assert one.mask.tolist() == [[[[0.0, 0.0, 0.0]]]] and one.slots.tolist() == [2]
    with pytest.raises(ValueError, match=r"^cannot pad 2 fed rows over 2 cached entries to 4 rows and span 5$"):
        padded_inputs(ids, positions, mask, start=2, rows=4, span=5, dtype=torch.float32)


@pytest.mark.parametrize("matmul", ["exact", pytest.param("stream", marks=needs_kernel)])
def test_the_pass_graph_run_eagerly_gives_the_lean_forwards_logits_and_cache(matmul, identity_compile):
    model = _model()
    eager_logits, eager_keys = _passes(Target(model, matmul=matmul))
    target = Target(model, matmul=matmul, compile="pass")
    logits, keys = _passes(target)
    state = target.compiled_pass
    assert state.active and state.calls == 5  # every pass but the prefill
    assert state.shapes == {(1, None), (4, None), (8, None)}  # decode; tree and chain of 3 (4 rows); chain of 5
    assert identity_compile == [{"fullgraph": True, "dynamic": False, "mode": None}]  # one compiled function
    _close(logits, eager_logits)
    _close(keys, eager_keys)
    graph = state._graph
    uses_ops = matmul == "stream"
    assert (graph.layers[0].linear is not torch.nn.functional.linear) == uses_ops
    assert (type(graph.norm_fn).__name__ == "OpOverload") == uses_ops  # the kernel's norm as its registered op


def test_passes_it_does_not_cover_run_the_eager_lean_forward(identity_compile):
    model = _model()
    target = Target(model, compile="pass")
    gen = torch.Generator().manual_seed(1)
    target.forward(torch.randint(0, VOCAB, (70,), generator=gen))  # a prefill: eager
    target.commit([])
    target.forward(torch.randint(0, VOCAB, (1,), generator=gen), Draft.chain(torch.randint(0, VOCAB, (64,))))
    target.commit([])  # 65 fed rows: past the last bucket
    target.forward(torch.tensor([3]), features=(0, 2))  # layer features: eager
    target.commit([])
    assert target.compiled_pass.calls == 0 and target.compiled_pass.active
    target.forward(torch.tensor([3]), features=True)  # the last normed state: compiled
    target.commit([])
    assert target.compiled_pass.calls == 1


@pytest.mark.parametrize("where", ["compile", "run"])
def test_a_failing_compiler_falls_back_to_the_eager_lean_forward(where, monkeypatch, caplog):
    model = _model()
    eager_logits, eager_keys = _passes(Target(model))

    def broken(fn, **options):
        if where == "compile":
            raise RuntimeError("no C++ compiler found")

        def run(*args):
            raise RuntimeError("InductorError: compilation failed")
        return run

    monkeypatch.setattr(torch, "compile", broken)
    target = Target(model, compile="pass")
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.compiled_pass"):
        logits, keys = _passes(target)
    assert all(torch.equal(a, b) for a, b in zip(logits, eager_logits, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(keys, eager_keys, strict=True))
    state = target.compiled_pass
    assert not state.active and state.calls == 0 and state.reason.startswith("RuntimeError: ")
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"the compiled whole pass failed, running the eager lean forward: {state.reason}"]


def test_a_model_without_the_lean_forward_warns_once_and_runs_its_own(caplog):
    with caplog.at_level(logging.WARNING, logger="specfamily.runtime.compiled_pass"):
        target = Target(tiny_model("gpt2", vocab_size=VOCAB, dtype=torch.float32), compile="pass")
    assert target.lean is None and target.compiled_pass is None
    assert [r.getMessage() for r in caplog.records] == [
        "compile='pass' needs the lean forward, which this model does not run: running it eagerly"]


def test_compile_options():
    model = _model()
    assert Target(model).compiled_pass is None and Target(model).lean.rotate is None
    for rope in (True, "rope"):
        target = Target(model, compile=rope)
        assert target.lean.rotate is not None and target.compiled_pass is None
    target = Target(model, compile="pass")
    assert isinstance(target.compiled_pass, CompiledPass) and target.lean.rotate is None
    with pytest.raises(ValueError, match=r"^compile must be one of \(False, True, 'rope', 'pass'\), got 'graphs'$"):
        Target(model, compile="graphs")


# --- a real inductor build: minutes on a loaded 2-core machine ---------------------------------------------------

@pytest.fixture(scope="module")
def compiled_tiny():
    """A tiny float32 target (stream kernel where it builds) through the compiled pass, and its eager twin."""
    model = _model(hidden=64, layers=2)
    matmul = "stream" if stream_kernel().available else "exact"
    return Target(model, matmul=matmul, compile="pass"), Target(model, matmul=matmul)


@pytest.mark.slow
def test_the_whole_pass_is_one_graph_without_breaks(compiled_tiny):
    target, _ = compiled_tiny
    graph = PassGraph.of(target.lean)
    start, rows = 9, 8
    keys = [torch.zeros(1, 1, 32, 32) for _ in graph.layers]
    values = [torch.zeros(1, 1, 32, 32) for _ in graph.layers]
    padded = padded_inputs(torch.ones(1, 5, dtype=torch.long), torch.arange(9, 14)[None],
                           torch.zeros(1, 1, 5, start + 5), start, rows, start + rows, torch.float32)
    with torch.inference_mode():
        explained = torch._dynamo.explain(graph)(padded.ids, padded.positions, padded.mask, padded.slots, keys, values)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    assert all(k[:, :, start : start + rows].abs().sum() > 0 for k in keys)  # every layer wrote its rows in place


@pytest.mark.slow
def test_compiled_logits_and_greedy_text_equal_the_eager_passes(compiled_tiny):
    target, eager = compiled_tiny
    logits, keys = _passes(target)
    eager_logits, eager_keys = _passes(eager)
    _close(logits, eager_logits, atol=1e-4)
    _close(keys, eager_keys, atol=1e-4)
    state = target.compiled_pass
    assert state.active, state.reason
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    calls = state.calls
    assert sf.generate(target, None, prompt, max_new_tokens=24).tokens == sf.generate(
        eager, None, prompt, max_new_tokens=24).tokens
    drafter = DepthRecorder(sf.create_drafter("prompt_lookup", target, gamma=4), gamma=4)
    ours = sf.generate(target, drafter, prompt, max_new_tokens=24)
    assert ours.tokens == sf.generate(eager, None, prompt, max_new_tokens=24).tokens
    assert state.active and state.calls > calls + 24 // 5 and drafter.stats.passes > 0
    assert {rows for rows, _ in state.shapes} <= {1, 2, 4, 8}


@pytest.mark.slow
def test_an_eagle_tree_on_the_zoo_target_gives_the_eager_text():
    loaded = sf.load_target("zoo:code-target", device="cpu")
    target = Target(loaded.model, loaded.tokenizer, compile="pass")
    prompt = loaded.tokenizer("def fibonacci(n):\n    ")["input_ids"]
    plain = sf.generate(loaded, None, prompt, max_new_tokens=32).tokens
    drafter = DepthRecorder(sf.create_drafter("eagle", target), gamma=3)
    ours = sf.generate(target, drafter, prompt, max_new_tokens=32)
    assert ours.tokens == plain
    state = target.compiled_pass
    assert state.active and state.calls > 0, state.reason
    assert drafter.stats.trees > 0 and drafter.stats.deepest_accepted >= 1, drafter.stats.summary()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_give_the_eager_text_over_static_spans():
    model = _model(hidden=64, layers=2).to("cuda")
    target, eager = Target(model, compile="pass"), Target(model)
    assert target.compiled_pass.cuda_graphs
    prompt = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    reference = sf.generate(eager, None, prompt, max_new_tokens=40).tokens
    lookup = sf.create_drafter("prompt_lookup", target, gamma=4)
    eagle = sf.create_drafter("eagle", target, weights="random", gamma=3)  # keeps the pass's features: copied
    for drafter in (None, lookup, eagle):
        assert sf.generate(target, drafter, prompt, max_new_tokens=40).tokens == reference, drafter
    state = target.compiled_pass
    assert state.active and state.calls > 0, state.reason
    assert all(span is not None and span % SPAN_STEP == 0 for _, span in state.shapes)
