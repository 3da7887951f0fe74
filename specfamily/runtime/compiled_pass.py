"""An optional compiled whole pass of the lean forward: every layer in one ``torch.compile`` graph, the cache written
in place, over bucketed shapes; the eager lean forward wherever it does not apply or fails.

``CompiledPass`` takes a lean forward's passes over a non-empty cache (decode and verify passes; the prefill stays
eager) and runs them through one graph per fed-row bucket (``ROW_BUCKETS``): the fed rows are padded to the bucket
(``padded_inputs``: the padding's rows see one cached entry, no real row sees them; their cache entries land past the
kept length, where the next pass overwrites them). The graph returns the last hidden state after the final norm; the
LM head multiplies only the rows the caller keeps, outside it. Cache lengths:

- on a CPU the attended span is the cache's exact length, a dynamic dimension of the graph (one graph per bucket);
- on CUDA (``mode="reduce-overhead"``: CUDA graphs, which replay fixed shapes at fixed addresses) the span is rounded
  up to ``SPAN_STEP`` entries and the cache's buffers are allocated once at ``capacity`` and marked static: one graph
  per (bucket, span).

The stream kernel's calls go through its ``torch.library`` ops (``specfamily.runtime.stream_ops``) so that the graph
has no break; ``fullgraph=True`` makes any break an error. Any error while compiling or running (no compiler, an
inductor failure, a break), a model or cache it does not cover: one warning naming why (``reason``), and the eager
lean forward from then on. Logits are not bit-identical to the eager pass (inductor fuses the elementwise work, and
rounds differently); docs/pass-cost.md gives the differences measured and what the path costs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import torch

from specfamily.runtime.kernel import stream_kernel
from specfamily.runtime.lean import LeanLayer, LeanLlama, plan_attention, rope
from specfamily.runtime.stream_ops import stream_ops

__all__ = ["COMPILE_OPTIONS", "ROW_BUCKETS", "SPAN_STEP", "CompiledPass", "PassGraph", "StaticKV", "bucket",
           "compile_kind", "compiled_pass", "padded_inputs"]

logger = logging.getLogger(__name__)

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # fed rows are padded up to one of these; more rows run eagerly
SPAN_STEP = 256  # CUDA graphs: attended spans rounded up to a multiple of this (static shapes)
CUDA_CAPACITY = 4096  # CUDA graphs: cache entries allocated once, at fixed addresses
MAX_GRAPHS = 128  # graphs one CompiledPass may compile (CUDA: one per bucket and span) before dynamo runs it eagerly


def bucket(rows: int, buckets: tuple[int, ...] = ROW_BUCKETS) -> int | None:
    """The smallest bucket holding ``rows`` fed rows, or None when none does."""
    return next((b for b in buckets if b >= rows), None)


@dataclass(frozen=True)
class Padded:
    """One pass's inputs padded to ``rows`` fed rows and a mask ``span`` entries wide."""

    ids: torch.Tensor  # (1, rows)
    positions: torch.Tensor  # (1, rows)
    mask: torch.Tensor  # (1, 1, rows, span) additive: 0 where a row attends, the dtype's min elsewhere
    slots: torch.Tensor  # (rows,) cache entries each row's key and value are written to: start, start + 1, ...


def padded_inputs(ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, start: int, rows: int,
                  span: int, dtype: torch.dtype) -> Padded:
    """A pass of q = ``ids.shape[1]`` fed rows over ``start`` cached entries, padded to ``rows`` rows and ``span``.

    ``mask``: the pass's additive mask (1, 1, q, start + q), or None for one row (it sees every cached entry and
    itself). Real rows keep their mask and see no padding; padded rows (ids and positions of the last real row) see
    entry 0 only, so that no row is all masked. ``span`` >= start + rows: columns past start + q are masked."""
    q = ids.shape[1]
    if not q <= rows <= span - start:
        raise ValueError(f"cannot pad {q} fed rows over {start} cached entries to {rows} rows and span {span}")
    minimum = torch.finfo(dtype).min
    full = torch.full((1, 1, rows, span), minimum, dtype=dtype, device=ids.device)
    if mask is None:
        full[:, :, :q, : start + q] = 0
    else:
        full[:, :, :q, : start + q] = mask
    full[:, :, q:, 0] = 0
    pad = rows - q
    if pad:
        ids = torch.cat((ids, ids[:, -1:].expand(1, pad)), dim=1)
        positions = torch.cat((positions, positions[:, -1:].expand(1, pad)), dim=1)
    slots = torch.arange(start, start + rows, device=ids.device)
    return Padded(ids, positions, full, slots)


class StaticKV:
    """The cache as the graph sees it: each layer's key and value buffers (B, kv heads, capacity, D), written in
    place at ``slots``; attention reads their first ``span`` entries."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor, span: int) -> None:
        self.keys, self.values, self.slots, self.span = keys, values, slots, span

    def update(self, key: torch.Tensor, value: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        key_buffer, value_buffer = self.keys[index], self.values[index]
        key_buffer.index_copy_(2, self.slots, key)
        value_buffer.index_copy_(2, self.slots, value)
        return key_buffer[:, :, : self.span], value_buffer[:, :, : self.span]


@dataclass(frozen=True)
class PassGraph:
    """What the compiled function reads: the lean forward's layers (products and norms as traceable ops), the
    embedding, rotary module and final norm; ``__call__`` is the function compiled."""

    layers: tuple[LeanLayer, ...]
    embed: torch.Tensor  # (V, H)
    rotary: torch.nn.Module
    norm: tuple[torch.Tensor, float]
    norm_fn: object  # (x, weight, eps) -> x
    groups: int
    probe: torch.Tensor
    masked_gqa: bool
    pack_queries: bool

    @classmethod
    def of(cls, lean: LeanLlama) -> PassGraph:
        """The lean forward's parts, the stream kernel's calls replaced by its registered ops."""
        layers, norm_fn = lean._layers, lean._norm_fn
        module = stream_kernel().module
        ops = stream_ops() if module is not None and lean._linear is module.linear else None
        if ops is not None:  # the extension's own functions: their registered ops instead
            layers = tuple(replace(layer, linear=ops.linear, norm=ops.norm) for layer in layers)
            norm_fn = ops.norm
        return cls(layers[: lean._config.num_hidden_layers], lean._embed.weight, lean._rotary, lean._norm, norm_fn,
                   lean._groups, lean._probe, lean._linear is not torch.nn.functional.linear, lean.pack_queries)

    def __call__(self, ids, positions, mask, slots, keys, values) -> torch.Tensor:
        """The last hidden state after the final norm (1, rows, H); keys and values written into the buffers."""
        hidden = torch.nn.functional.embedding(ids, self.embed)
        cos, sin = rope(self.rotary, hidden, positions)
        rows, span = ids.shape[1], mask.shape[-1]
        attend = plan_attention(mask, rows, self.groups, self.probe, masked_gqa=self.masked_gqa,
                                pack_queries=self.pack_queries)
        kv = StaticKV(keys, values, slots, span)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, attend, kv)
        return self.norm_fn(hidden, *self.norm)


@dataclass
class CompiledPass:
    """The lean forward's decode and verify passes through one compiled graph per shape bucket (module docstring);
    calling it returns None where it does not apply, and the caller runs the eager lean forward."""

    lean: LeanLlama
    buckets: tuple[int, ...] = ROW_BUCKETS
    reason: str | None = None  # why the eager path runs, once it does for good
    calls: int = 0  # passes that ran the compiled graph
    shapes: set[tuple[int, int | None]] = field(default_factory=set)  # (rows, span or None: dynamic) run so far
    _graph: PassGraph | None = None
    _compiled: object = None

    @property
    def active(self) -> bool:
        return self.reason is None

    @property
    def cuda_graphs(self) -> bool:
        """CUDA graphs (``reduce-overhead``): static spans and buffers; else inductor with a dynamic span."""
        return self.lean._embed.weight.device.type == "cuda"

    def __call__(self, ids, positions, mask, cache, keep: int, features: bool | tuple[int, ...] = False):
        """(logits (1, keep, V), hidden (1, q, H) or None) as the lean forward returns them, or None (not taken)."""
        q, start = ids.shape[1], cache.get_seq_length()
        rows = bucket(q, self.buckets)
        if self.reason is not None or rows is None or start == 0 or isinstance(features, tuple):
            return None
        try:
            hidden = self._run(ids, positions, mask, cache, start, q, rows)
        except Exception as err:  # noqa: BLE001 - any failure of the compiler stack: eager for good
            self._fail(err, cache, start)
            return None
        self.calls += 1
        logits = self.lean._linear(hidden[:, q - keep : q], *self.lean._head)
        if not features:
            return logits, None
        # a CUDA graph's output is its own buffer, overwritten by the next replay: features kept by a drafter are copied
        return logits, (hidden[:, :q].clone() if self.cuda_graphs else hidden[:, :q])

    def _run(self, ids, positions, mask, cache, start: int, q: int, rows: int) -> torch.Tensor:
        cuda = self.cuda_graphs
        span = -(-(start + rows) // SPAN_STEP) * SPAN_STEP if cuda else start + rows
        layers = cache.layers
        buffers = [layer.reserve(span, CUDA_CAPACITY if cuda else 0) for layer in layers]
        keys, values = [b[0] for b in buffers], [b[1] for b in buffers]
        padded = padded_inputs(ids, positions, mask, start, rows, span, keys[0].dtype)
        compiled = self._compiled_fn()
        if cuda:
            for buffer in (*keys, *values):
                torch._dynamo.mark_static_address(buffer)
            torch.compiler.cudagraph_mark_step_begin()  # each pass is a new step: the last one's outputs are read
        else:
            torch._dynamo.maybe_mark_dynamic(padded.mask, 3)
            for buffer in (*keys, *values):
                torch._dynamo.maybe_mark_dynamic(buffer, 2)
        with torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS):  # dynamo's default, 8, is one per bucket
            hidden = compiled(padded.ids, padded.positions, padded.mask, padded.slots, keys, values)
        for layer in layers:
            layer.expose(start + q)
        self.shapes.add((rows, span if cuda else None))
        return hidden

    def _compiled_fn(self):
        if self._compiled is None:
            self._graph = PassGraph.of(self.lean)
            mode = "reduce-overhead" if self.cuda_graphs else None
            self._compiled = torch.compile(self._graph, fullgraph=True, dynamic=False, mode=mode)
        return self._compiled

    def _fail(self, err: Exception, cache, start: int) -> None:
        self.reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        logger.warning("the compiled whole pass failed, running the eager lean forward: %s", self.reason)
        for layer in cache.layers:  # the pass never happened: the cache keeps its entries
            if getattr(layer, "_buffers", None) is not None and layer.keys is not None and layer.keys.dim() == 4:
                layer.keys, layer.values = layer.keys[:, :, :start], layer.values[:, :, :start]


COMPILE_OPTIONS = (False, True, "rope", "pass")  # Target(compile=...): off, the rope (True, "rope"), the whole pass


def compile_kind(compile: bool | str) -> str | None:
    """What ``Target(compile=...)`` compiles: None, ``"rope"`` (True or "rope") or ``"pass"``; else ValueError."""
    if compile is False or compile is None:
        return None
    if compile is True or compile == "rope":
        return "rope"
    if compile == "pass":
        return "pass"
    raise ValueError(f"compile must be one of {COMPILE_OPTIONS}, got {compile!r}")


def compiled_pass(lean: LeanLlama | None, compile: bool | str) -> CompiledPass | None:
    """``Target(compile=...)``'s whole-pass path: a CompiledPass for ``"pass"`` over a lean forward, else None
    (``True``/``"rope"``: the rope alone, ``specfamily.runtime.compiled``; a model without a lean forward: the
    model's own forward, with one warning)."""
    if compile_kind(compile) != "pass":
        return None
    if lean is None:
        logger.warning("compile='pass' needs the lean forward, which this model does not run: running it eagerly")
        return None
    return CompiledPass(lean)
