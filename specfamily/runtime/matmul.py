"""How the lean forwards multiply a few rows by a weight matrix: ``exact``, ``skinny``, ``stream``, or ``auto``.

A decode step or a verify pass multiplies 1 to a few rows by every weight matrix of the model; its time is the time
it takes to read the weights. F.linear computes x @ W^T; on a CPU, MKL runs one row as a matrix-vector product and
2-8 rows with a general kernel, and on some CPUs both read the weights at a fraction of the memory bandwidth, slower
with every extra row (measured: docs/bandwidth-smollm2.md).

- ``exact``: F.linear, bit-identical to transformers' forward (the default).
- ``skinny``: (W @ x^T)^T, which MKL runs with the weight as the long side.
- ``stream``: a C++ kernel (``specfamily.runtime.kernel``) that reads each weight once per call, as a packed copy made
  on its first product (one more copy of each weight it multiplies), the rows' sums held in registers; any number of
  rows, 16 at a time. Built on first use; where it cannot build, one warning and ``auto`` over the other two.
- ``auto``: times the kinds on the model's own weights, interleaved, and keeps ``exact`` unless another kind takes
  at most ``AUTO_MARGIN`` of its time, or ``stream`` no more than it (``STREAM_MARGIN``: stream also brings the
  layer loop and the attention kernel, which the products' timing leaves out); ``stream`` is then preferred to
  ``skinny`` unless ``skinny`` beats it by ``AUTO_MARGIN``. ``choose_matmul`` returns the timings with the choice
  (``MatmulChoice``); run.json records them.

``skinny`` and ``stream`` sum in float32 in other orders than F.linear: logits differ from transformers' in the last
bits (as between two BLAS libraries), and greedy text can differ only where two tokens' logits tie to float
rounding. Both multiply float32 on a CPU only: asked for other weights, they are refused.

Batch invariance: only ``stream`` (``BATCH_INVARIANT_KINDS``) gives a row the same bits whatever rows it is
multiplied with, so a token's cache entries do not depend on whether it came in a prefill, a draft pass or alone.
``exact`` and ``skinny`` are BLAS's products, which pick kernels (and summation orders) by the number of rows: not
batch-invariant. Where the kernel cannot build, ``stream`` falls back to them, and ``MatmulChoice.note`` says so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specfamily.runtime.kernel import drop_packed, stream_kernel

__all__ = ["BATCH_INVARIANT_KINDS", "MATMUL_KINDS", "SKINNY_MAX_ROWS", "MatmulChoice", "choose_matmul", "linear_for",
           "resolve_matmul", "skinny_linear", "stream_linear"]

MATMUL_KINDS = ("exact", "skinny", "stream", "auto")
FAST_KINDS = ("stream", "skinny")  # what auto may take instead of exact, in order of preference
SKINNY_MAX_ROWS = 8  # rows skinny takes; past them F.linear's own kernel is as fast (docs/bandwidth-smollm2.md)
BATCH_INVARIANT_KINDS = ("stream",)  # kinds whose row results do not depend on the other rows of the product
AUTO_MARGIN = 0.85  # a kind must take at most this share of the preferred kind's time to be chosen over it
STREAM_MARGIN = 1.0  # stream over exact as soon as its products are no slower: it also brings what they leave out
AUTO_BYTES = 64 << 20  # weights timed by auto: more than a CPU's last-level cache, as a real pass reads them
AUTO_ROWS = (1, 4)  # rows per product timed by auto: a decode step and a short verify pass
AUTO_ROUNDS = 9  # timed rounds per kind (after one warm-up), interleaved, the kind that goes first rotating

Linear = Callable[..., torch.Tensor]  # (x, weight, bias=None) -> x @ weight^T + bias


@dataclass(frozen=True)
class MatmulChoice:
    """The resolved kind, what was asked, and (``auto``) the median seconds of one timed round per kind."""

    kind: str  # exact, skinny or stream
    asked: str  # exact, skinny, stream or auto
    seconds: dict[str, float] = field(default_factory=dict)  # kind -> median s over AUTO_ROWS x the timed weights
    note: str = ""  # why the kind differs from what was asked, if it does

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's product is bit-identical whatever rows come with it (``BATCH_INVARIANT_KINDS``)."""
        return self.kind in BATCH_INVARIANT_KINDS


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, max_rows: int | None = SKINNY_MAX_ROWS
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as (weight @ x^T)^T for at most ``max_rows`` rows of float32 x.

    One row is fed twice (a single column would take the matrix-vector kernel again); the result is contiguous,
    as F.linear's is. More rows, and other dtypes (where the bias would be added after rounding), go to F.linear.
    """
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    if rows == 0 or (max_rows is not None and rows > max_rows) or weight.dim() != 2 or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    columns = torch.cat((flat, flat)) if rows == 1 else flat
    out = torch.mm(weight, columns.t()).t()[:rows].contiguous()
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.shape[0])


def stream_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by the streaming kernel (float32 on a CPU, any number of rows, each row's bits
    independent of the others).

    Raises RuntimeError naming why when the kernel is not available here.
    """
    return _stream_module().linear(x, weight, bias)


def stream_norm(linear: Linear) -> Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None:
    """The stream kernel's one-call RMSNorm when ``linear`` is the kernel's own product or says it multiplies float32
    CPU rows (an attribute ``stream_norm`` set to True: the int8 drafts' products), so the lean forwards norm with it
    too (one call for seven small ops); else None (they keep the families' op-for-op RMSNorm)."""
    module = stream_kernel().module if linear is not F.linear and linear is not skinny_linear else None
    wants = module is not None and (linear is module.linear or getattr(linear, "stream_norm", False) is True)
    return module.rms_norm if wants else None  # stream_norm True: a product of float32 CPU rows (int8 drafts)


def head_product(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 linear: Linear | None = None) -> torch.Tensor:
    """A drafter's LM head over ``hidden`` (..., H) -> (..., V), ``linear`` being the target's kind of product.

    Rows of a tree depth (k, H) while drafting (no gradients): the stream kernel reads the weight once for all of
    them; otherwise W @ h^T reads the (V, H) weight as stored, which on CPU (MKL) is several times cheaper than
    F.linear's h @ W^T for a few rows and a large vocabulary. Anything else (a single row, training) multiplies with
    ``linear``, F.linear by default: what nn.Linear.forward computes."""
    if hidden.dim() == 2 and hidden.shape[0] > 1 and not torch.is_grad_enabled():
        if linear not in (None, F.linear, skinny_linear):
            return linear(hidden, weight, bias)
        return skinny_linear(hidden, weight, bias, max_rows=None)
    return (linear or F.linear)(hidden, weight, bias)


def linear_for(kind: str) -> Linear:
    """The linear function of a resolved kind (``exact``, ``skinny`` or ``stream``)."""
    if kind == "exact":
        return F.linear
    if kind == "skinny":
        return skinny_linear
    if kind == "stream":
        return _stream_module().linear  # the extension's own function: no Python frame per product
    raise ValueError(f"matmul must be 'exact', 'skinny' or 'stream' once resolved, got {kind!r}")


def resolve_matmul(kind: str, model: nn.Module | None) -> str:
    """The kind ``model``'s lean forward multiplies with (``choose_matmul(kind, model).kind``)."""
    return choose_matmul(kind, model).kind


def choose_matmul(kind: str, model: nn.Module | None) -> MatmulChoice:
    """``exact``, ``skinny`` or ``stream`` for ``model``: the kind asked for, or for ``auto`` the one measured here.

    ``model`` None: nothing will multiply with the choice (no lean forward), so it is ``exact`` whatever was asked.
    ``skinny`` and ``stream`` on weights other than float32 on a CPU: ValueError. ``stream`` where the kernel cannot
    build: ``auto`` over the other kinds (the kernel's loader has warned once, naming why).
    """
    if kind not in MATMUL_KINDS:
        raise ValueError(f"matmul must be one of {MATMUL_KINDS}, got {kind!r}")
    if model is None or kind == "exact":
        return MatmulChoice("exact", kind)
    weights = timed_weights(model)
    if kind in FAST_KINDS:
        _check_cpu_float32(kind, model)
        if kind == "skinny" or stream_kernel().available:
            return MatmulChoice(kind, kind)
        chosen = _auto(weights, "stream")
        note = f"stream kernel unavailable: {stream_kernel().reason} ({chosen.kind}: not batch-invariant)"
        return MatmulChoice(chosen.kind, kind, chosen.seconds, note)
    return _auto(weights, "auto")


def _auto(weights: list[torch.Tensor], asked: str) -> MatmulChoice:
    if not weights or not all(w.device.type == "cpu" and w.dtype == torch.float32 for w in weights):
        return MatmulChoice("exact", asked, note="auto times float32 weights on a CPU only")
    kinds = {"exact": F.linear, "skinny": skinny_linear}
    if stream_kernel().available:
        kinds["stream"] = stream_linear
    seconds = kind_seconds(weights, kinds)
    choice = pick_kind(seconds)
    if choice != "stream":
        drop_packed(weights)  # the copies the stream kernel's timing made: nothing will multiply with them
    return MatmulChoice(choice, asked, seconds)


def pick_kind(seconds: dict[str, float], margin: float = AUTO_MARGIN) -> str:
    """``exact`` unless a kind of ``FAST_KINDS`` takes at most ``margin`` of the preferred kind's time (hysteresis:
    noise cannot flip a near tie, and ``stream`` is kept over a ``skinny`` that is not clearly faster).

    ``stream`` needs only ``STREAM_MARGIN`` (no slower) against ``exact``: the timing covers products alone, and
    ``stream`` also turns on the C++ layer loop and the batch-invariant attention kernel, which a whole pass gains on
    top (on an Intel Xeon where stream's products took 0.88 of exact's, a drafted pass of 4 draft tokens cost 1.70x a
    plain one with exact and 1.07x with stream: docs/pass-goals.md)."""
    choice = "exact"
    for kind in FAST_KINDS:
        share = STREAM_MARGIN if (kind, choice) == ("stream", "exact") else margin
        if kind in seconds and seconds[kind] <= share * seconds[choice]:
            choice = kind
    return choice


def timed_weights(model: nn.Module, budget: int = AUTO_BYTES) -> list[torch.Tensor]:
    """The model's linear weights in module order, up to ``budget`` bytes (at least one)."""
    weights, total = [], 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and total < budget:
            weights.append(module.weight)
            total += module.weight.numel() * module.weight.element_size()
    return weights


@torch.inference_mode()
def kind_seconds(
    weights: Sequence[torch.Tensor], kinds: dict[str, Linear], rows: Sequence[int] = AUTO_ROWS,
    rounds: int = AUTO_ROUNDS, seed: int = 0,
) -> dict[str, float]:
    """Median seconds, per kind, of one round: ``rows`` rows through every weight, for each count in ``rows``.

    The kinds run interleaved, round by round (after a warm-up round), the kind that goes first rotating, so a
    machine's slow spell falls on all of them. Inputs come from a generator of their own (the global RNG is left
    alone).
    """
    generator = torch.Generator().manual_seed(seed)
    widths = {w.shape[1] for w in weights}
    inputs = {(n, d): torch.randn(n, d, generator=generator, dtype=weights[0].dtype) for n in rows for d in widths}
    names = list(kinds)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds + 1):  # round 0 warms every kind up
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            linear = kinds[name]
            start = time.perf_counter()
            for n in rows:
                for weight in weights:
                    linear(inputs[n, weight.shape[1]], weight)
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _check_cpu_float32(kind: str, model: nn.Module) -> None:
    weights = (m.weight for m in model.modules() if isinstance(m, nn.Linear))
    odd = next((w for w in weights if w.device.type != "cpu" or w.dtype != torch.float32), None)
    if odd is not None:
        raise ValueError(f"matmul={kind!r} multiplies float32 weights on a CPU; this model has {odd.dtype} weights on "
                         f"{odd.device} (use matmul='exact' or 'auto')")


def _stream_module():
    kernel = stream_kernel()
    if kernel.module is None:
        raise RuntimeError(f"the stream matmul kernel is not available here: {kernel.reason}")
    return kernel.module
