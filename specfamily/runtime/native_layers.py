"""The lean forward's layer loop in C++ (``csrc/layers/native_layers.cpp``): built on first use, cached, or why not.

A plain pass of a small model runs a few thousand small ATen ops between its products (views, transposes, the rope's
products and roll, the cache's slices and copies, sdpa, the residual adds); from Python each is a round trip through
the interpreter on the main thread, which the other threads cannot share. ``NativeLayers`` runs every decoder layer of
one pass in C++, with the same ATen calls in the same order and with the same arguments as ``LeanLayer`` and the
stream kernel's own product and norm (reached without Python, through the capsules the kernel's module exports), so
the hidden state and every cache entry are bit-identical to the Python loop's (tests compare them with
``torch.equal``). The embedding, the rope's cos and sin, the attention plan, the final norm and the LM head stay in
Python (a few calls a pass).

It takes (``NativeLayers.__call__`` returns the hidden state; None: the Python loop runs, unchanged) the target's
passes over a non-empty cache of ``BufferedLayer`` layers (decode and verify passes: chain and tree, masked or packed
as ``plan_attention`` says), float32 on a CPU, batch 1, in inference mode, with the uncompiled rope. It is built only
for a lean forward multiplying with the stream kernel, all of whose layers act with SiLU (``native_layers``); layer
features (EAGLE-3's) come back as the inputs of the layers asked for; ``skipping`` (self-speculation) keeps the Python
loop. Batched passes (``specfamily.core.batch_target``) run through ``forward_slots`` where the lean forward attends
with the attention kernel (``specfamily.runtime.batch_lean.slot_forward``): the fed rows of every slot packed for the
products, each slot's rope, cache writes and attention on its own buffer row, one call a pass.

The extension is built like the stream kernel (``specfamily.runtime.kernel.build_extension``: the user's cache, one
folder per sources, flags, CPU, torch and Python, a file lock), once per process. Where it cannot build (no
compiler, a compile error, ``SPECFAMILY_NO_NATIVE_LAYERS`` set, or no stream kernel) it logs one warning naming why
and the Python loop runs.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from specfamily.runtime.attention import attention_build
from specfamily.runtime.kernel import (
    Extension,
    KernelUnavailable,
    build_source,
    load_extension,
    short_error,
    stream_kernel,
)
from specfamily.runtime.kv_cache import BufferedLayer, KVArena, shared_arena
from specfamily.runtime.lean import Attend, LeanLayer, LeanLlama, rotate_pair

__all__ = ["DISABLE_ENV", "NativeBuild", "NativeLayers", "build_native", "native_build", "native_layers",
           "native_source", "native_unsupported"]

logger = logging.getLogger(__name__)

DISABLE_ENV = "SPECFAMILY_NO_NATIVE_LAYERS"  # set (non-empty, not "0"): never build, run the Python loop
NAME = "specfamily_native_layers"


NativeBuild = Extension  # the native loop's extension record (``module.NativeLayers``)


def native_source() -> Path:
    """The C++ source of the extension, shipped inside the package."""
    return Path(__file__).resolve().parent / "csrc" / "layers" / "native_layers.cpp"


@functools.cache
def native_build() -> Extension:
    """The extension, built (or loaded from the cache) once per process; on failure one warning and the reason."""
    return load_extension(DISABLE_ENV, _build_beside_stream, logger, "native layer loop",
                          "the lean forward runs its Python loop")


def _build_beside_stream() -> ModuleType:
    if not stream_kernel().available:
        raise KernelUnavailable(f"the stream kernel is not available ({stream_kernel().reason})")
    return build_native()


@functools.cache
def build_native(verbose: bool = False) -> ModuleType:
    """Compile (or reuse the cached build of) the extension and import it; raises ``KernelUnavailable`` or the
    build's own error."""
    return build_source(NAME, native_source(), "native_layers", "native layer loop", verbose)


def _fields(layer: LeanLayer) -> tuple:
    """A layer's fields in the order the C++ constructor reads them."""
    return (layer.norm1[0], float(layer.norm1[1]), layer.q, layer.k, layer.v, layer.o, layer.norm2[0],
            float(layer.norm2[1]), layer.gate, layer.up, layer.down, layer.head_dim, float(layer.scaling))


def native_unsupported(lean: LeanLlama) -> str | None:
    """Why ``lean``'s layers cannot run natively; None when they can."""
    module = stream_kernel().module
    if module is None or lean._linear is not module.linear:
        return "the lean forward does not multiply with the stream kernel"
    layers = lean._layers[: lean._config.num_hidden_layers]
    if any(layer.act is not F.silu for layer in layers):
        return "a layer's activation is not SiLU"
    if any(layer.norm is not module.rms_norm or layer.linear is not module.linear for layer in layers):
        return "a layer does not norm and multiply with the stream kernel"
    return None


class NativeLayers:
    """One lean forward's layers in C++; calling it runs one pass's layers, or returns None where it does not apply
    (module docstring). ``calls`` counts the passes it ran."""

    def __init__(self, lean: LeanLlama, module: ModuleType, stream: ModuleType | None = None,
                 attention: ModuleType | None = None) -> None:
        """``stream``: the stream kernel's module whose product and norm the loop calls (default: this process's
        ``stream_kernel()``); ``attention``: the attention kernel's module its planned passes attend with (default:
        this process's ``attention_build()``). A benchmark passes other builds to A/B the kernels."""
        self.lean = lean
        self.count = lean._config.num_hidden_layers
        own = attention_build().module if lean.attention is not None else None
        self._attend = None if own is None else own.attend  # the kernel its passes may be planned with
        attention = None if own is None else attention or own  # the kernel that attends (another build in an A/B)
        self._native = module.NativeLayers(stream or stream_kernel().module, [_fields(layer) for layer in
                                                                               lean._layers[: self.count]], attention)
        self.reason: str | None = None  # why the Python loop runs for good, after a native pass failed

    def __deepcopy__(self, memo: dict) -> NativeLayers | None:
        """Shared where the copy shares the model's weights (a batch slot's copy of a drafter that owns a draft target:
        the weights are read-only and nothing here belongs to a request); None (the copy runs the Python loop) where
        the weights themselves are copied, as this C++ object holds the original ones and cannot be copied."""
        weight = self.lean._layers[0].q[0]
        return self if memo.get(id(weight)) is weight else None

    @property
    def calls(self) -> int:
        """Passes run natively so far."""
        return self._native.calls

    @property
    def fused_layers(self) -> int:
        """Layers (over all native passes) whose rope and cache writes ran as one loop rather than ATen's ops."""
        return self._native.fused_layers

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
                 cache, inputs: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """(the last layer's output (1, q, H), the inputs of the layers ``inputs`` names (ascending ids)), the cache's
        layers written and exposed; None: not taken."""
        layers = getattr(cache, "layers", None)
        if (self.reason is not None or attend.rotate is not rotate_pair or hidden.shape[0] != 1
                or hidden.dtype != torch.float32 or hidden.device.type != "cpu" or not torch.is_inference_mode_enabled()
                or torch.is_grad_enabled() or layers is None or len(layers) != self.count
                or (attend.kernel is not None and attend.kernel is not self._attend)):
            return None
        q = hidden.shape[1]
        arena = shared_arena(layers)
        prepared = None if arena is None else _in_arena(arena, q)
        if prepared is None:  # layer by layer: no shared arena, or its layers hold different lengths
            arena, prepared = None, _per_layer(layers, q)
        if prepared is None:
            return None
        keys, values, starts = prepared
        try:
            out = self._native.forward(hidden, cos, sin, attend.mask, attend.causal, attend.gqa, attend.pack,
                                       attend.groups, keys, values, starts, list(inputs), attend.kernel is not None,
                                       attend.visible)
        except Exception as error:  # noqa: BLE001 - any failure: the Python loop from now on, this pass's too
            # no layer was exposed: the cache keeps its entries (the Python loop rewrites the buffers' tails)
            self.reason = short_error(error)
            logger.warning("the native layer loop failed, running the Python loop: %s", self.reason)
            return None
        if arena is not None:
            arena.expose(starts[0] + q)  # one narrow and one unbind for every layer
        else:
            for layer, start in zip(layers, starts, strict=True):
                layer.expose(start + q)
        return out

    def slots_ready(self, lean: LeanLlama) -> bool:
        """Whether ``forward_slots`` takes a batched pass of ``lean`` now: its kernel is the attention kernel this
        loop was built with, the rope uncompiled, no earlier native failure, inference mode, no gradients."""
        return (self.reason is None and lean.attention is not None and lean.attention is self._attend
                and lean.rotate is None and torch.is_inference_mode_enabled() and not torch.is_grad_enabled())

    def forward_slots(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, buffers: tuple[list, list],
                      slots: list[int], lengths: list[int], counts: list[int], visible: list[torch.Tensor | None],
                      inputs: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A batched pass's layers on its packed rows (1, N, H) (``csrc/layers/native_layers.cpp``'s
        ``forward_slots``): slot ``slots[s]`` feeds ``counts[s]`` rows after its ``lengths[s]`` cached entries, its
        keys and values written into ``buffers`` (each layer's (slots, kv heads, capacity, D) keys and values) and
        its rows attending over them as a batch-1 pass with the attention kernel would. Raises on a failure."""
        keys, values = buffers
        return self._native.forward_slots(hidden, cos, sin, keys, values, slots, lengths, counts, visible,
                                          list(inputs))


# keys buffers, values buffers, entries held: one a layer
Prepared = tuple[list[torch.Tensor], list[torch.Tensor], list[int]]


def _per_layer(layers, q: int) -> Prepared | None:
    """Each layer's buffers reserved for ``q`` more entries, layer by layer; None where a layer holds none in place."""
    starts = [_kept(layer) for layer in layers]
    if 0 in starts:
        return None
    buffers = [layer.reserve(start + q) for layer, start in zip(layers, starts, strict=True)]
    return [b[0] for b in buffers], [b[1] for b in buffers], starts


def _in_arena(arena: KVArena, q: int) -> Prepared | None:
    """``_per_layer`` on a shared arena whose layers hold as many entries each: grown once for all, its buffers made
    once per arena tensor (``KVArena.buffers``); None where the layers hold different lengths, or none."""
    layers = arena.layers
    if arena.following:  # every layer holds the last expose's entries
        start = arena.length
        if start == 0:
            return None
    else:
        start = layers[0].keys.shape[-2]
        if start == 0 or any(layer.keys.shape[-2] != start for layer in layers):
            return None
    if start + q > arena.capacity:
        arena.grow(layers[0].keys, start + q)
    keys, values = arena.buffers()
    return keys, values, [start] * len(layers)


def _kept(layer) -> int:
    """The entries a ``BufferedLayer`` holds in place (0: none, or not a layer written in place)."""
    if type(layer) is not BufferedLayer or layer.keys is None or layer.keys.dim() != 4:
        return 0
    return layer.keys.shape[-2]


def native_layers(lean: LeanLlama | None, enabled: bool = True) -> NativeLayers | None:
    """``lean``'s layers in C++, or None (the Python loop): not ``enabled``, no lean forward, a lean forward it does
    not cover (logged at debug level), or no build (one warning, ``native_build``)."""
    if not enabled or lean is None:
        return None
    reason = native_unsupported(lean)
    if reason is not None:
        logger.debug("native layer loop not used: %s", reason)
        return None
    build = native_build()
    if build.module is None:
        return None
    try:
        return NativeLayers(lean, build.module)
    except Exception as error:  # noqa: BLE001 - e.g. a stream kernel whose capsules this build does not know
        logger.warning("native layer loop unavailable (%s): the lean forward runs its Python loop", short_error(error))
        return None
