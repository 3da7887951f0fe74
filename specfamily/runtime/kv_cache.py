"""The KV-cache layer of the target wrapper: a layer that appends in place.

On a small model a decode step is dominated by per-call work rather than arithmetic: transformers'
DynamicLayer copies the whole cache at every append, and the module tree costs a Python call per
module. ``BufferedLayer`` writes only the new entries; ``LeanLlama`` (``specfamily.runtime.lean``) runs a
Llama/Mistral/Qwen2 model's own tensor operations without the module calls, bit-identical to its forward.
Anything the lean forward does not cover exactly is left to the model's forward (``lean_unsupported`` says why).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicLayer

from specfamily.runtime.huge_pages import huge_empty

__all__ = ["BufferedLayer", "KVArena", "shared_arena"]


class BufferedLayer(DynamicLayer):
    """A DynamicLayer that appends into a preallocated buffer instead of concatenating.

    ``keys``/``values`` stay what a DynamicLayer holds, (B, H, length, D) tensors, but as views of a buffer
    with spare room along the sequence, so a pass writes only its new entries and cropping is a narrower
    view. The buffer grows by half when full. Anything that replaces ``keys`` with a tensor of its own, or
    updates with autograd or outside inference mode, takes the concatenating path, and the next update
    moves the entries into a fresh buffer.
    """

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    _own: torch.Tensor | None = None  # the ``keys`` view this layer last set: while ``keys is _own``, it is ours
    arena: KVArena | None = None  # the buffers' home when the layers share one tensor (``KVArena.layer``)
    in_arena: bool = False  # ``_buffers`` are this layer's slot of ``arena`` (else buffers of its own, or none)
    _keys: torch.Tensor | None = None
    _values: torch.Tensor | None = None
    _seen: int = -1  # the arena's expose whose views ``_keys``/``_values`` are (``KVArena.expose``: made when read)
    _index: int = 0  # its place in ``arena.layers`` (``KVArena.layer``)

    @property
    def keys(self) -> torch.Tensor | None:
        self._follow()
        return self._keys

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._leave_arena()
        self._keys = value

    @property
    def values(self) -> torch.Tensor | None:
        self._follow()
        return self._values

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._leave_arena()
        self._values = value

    def _follow(self) -> None:
        """Before ``keys`` or ``values`` is read: this layer's views of its arena's last expose, if not made yet."""
        arena = self.arena
        if arena is not None and arena.following and self._seen != arena.epoch:
            self._take(arena)

    def _take(self, arena: KVArena) -> None:
        """This layer's views of the arena's last ``expose``, as that expose would have set them."""
        self._keys, self._values = arena.views(self._index, arena.length)
        self._own, self._seen = self._keys, arena.epoch

    def _leave_arena(self) -> None:
        """Before ``keys`` or ``values`` is set from anywhere but the arena: every layer takes its views of the last
        expose (they stop following it now), then the arena counts its layers as set one by one again."""
        arena = self.arena
        if arena is not None and arena.following:
            for layer in arena.layers:
                if layer._seen != arena.epoch:
                    layer._take(arena)
            arena.following = False

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.requires_grad or not torch.is_inference_mode_enabled():
            self._buffers = None
            return super().update(key_states, value_states, *args, **kwargs)
        length, new = (self.keys.shape[-2] if self.keys.dim() == 4 else 0), key_states.shape[-2]
        if not self._holds(key_states, length + new):
            self._grow(key_states, value_states, length, length + new)
        key_buffer, value_buffer = self._buffers
        key_buffer[:, :, length : length + new] = key_states
        value_buffer[:, :, length : length + new] = value_states
        self.expose(length + new)
        return self.keys, self.values

    @property
    def owned(self) -> bool:
        """``keys`` is the view of the buffers this layer last set (not replaced since, and not empty)."""
        return self._own is not None and self.keys is self._own

    def _holds(self, key_states: torch.Tensor, needed: int) -> bool:
        """The buffer exists, fits ``needed`` entries of this shape, and ``keys`` is still a view of its start."""
        if self._buffers is None:
            return False
        key_buffer = self._buffers[0]
        shape = key_buffer.shape
        return (
            shape[-2] >= needed
            and shape[:2] == key_states.shape[:2]
            and shape[-1] == key_states.shape[-1]
            and (self.keys.dim() != 4 or self.keys.data_ptr() == key_buffer.data_ptr())
        )

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, needed: int) -> None:
        if self.arena is not None and self.arena.fits(key_states, value_states):
            self._grow_in_arena(key_states, length, needed)
            return
        capacity = needed + max(needed // 2, 64)
        batch, heads, _, dim = key_states.shape
        self.in_arena = False
        key_buffer = key_states.new_empty(batch, heads, capacity, dim)
        value_buffer = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if length:
            key_buffer[:, :, :length] = self.keys
            value_buffer[:, :, :length] = self.values
        self._buffers = (key_buffer, value_buffer)
        self._own = None  # ``keys`` is a view of the old buffers until the next ``expose``

    def _grow_in_arena(self, key_states: torch.Tensor, length: int, needed: int) -> None:
        """``_grow`` for a layer of an arena: the arena grows for every layer at once (the views it owns follow);
        entries held elsewhere (a replaced ``keys``) are copied into this layer's slot."""
        arena = self.arena
        if needed > arena.capacity:
            arena.grow(key_states, needed)
        key_buffer, value_buffer = arena.slot(self)
        if length and self.keys.data_ptr() != key_buffer.data_ptr():
            key_buffer[:, :, :length] = self.keys
            value_buffer[:, :, :length] = self.values
        self._buffers, self.in_arena = (key_buffer, value_buffer), True
        if not self.owned or self.keys.data_ptr() != key_buffer.data_ptr():
            self._own = None

    def adopt(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor) -> None:
        """New buffers from the arena (its entries copied): ``keys`` follows them while it is this layer's own view."""
        own = self._buffers is not None and self.in_arena and self.owned
        if self._buffers is not None and not self.in_arena:
            return  # buffers of its own (entries of another shape): the arena's slot stays unused
        self._buffers, self.in_arena = (key_buffer, value_buffer), True
        if own:
            self.expose(self.keys.shape[-2])
        else:
            self._own = None

    def reserve(self, needed: int, capacity: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers, grown (the entries held kept) to fit ``needed`` entries, at least ``capacity``:
        a compiled pass (``specfamily.runtime.compiled_pass``) writes its entries into them in place. Needs the layer
        to hold entries already (4-D ``keys``)."""
        if self.owned and needed <= self._buffers[0].shape[-2]:  # per pass: no shape checks
            return self._buffers
        if not self._holds(self.keys, needed):
            self._grow(self.keys, self.values, self.keys.shape[-2], max(needed, capacity))
        return self._buffers

    def expose(self, length: int) -> None:
        """``keys``/``values``: the buffers' first ``length`` entries (after a pass wrote into them in place)."""
        key_buffer, value_buffer = self._buffers
        self.keys, self.values = key_buffer.narrow(2, 0, length), value_buffer.narrow(2, 0, length)
        self._own = self.keys

    def cut(self, length: int) -> None:
        """Keep the first ``length`` entries (at most those held): a narrower view of the buffers while ``keys`` is
        still this layer's own view, a slice of ``keys``/``values`` otherwise; no entry is copied either way."""
        if self.keys is None or self.keys.dim() != 4:
            return
        if self.owned:
            self.expose(min(length, self.keys.shape[-2]))
        else:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]

    def reset(self) -> None:
        self._buffers = self._own = None
        self.in_arena = False
        super().reset()


class KVArena:
    """Every layer's key and value buffers as slices of one tensor (layers, 2, B, H, capacity, D), so that a tree's
    commit moves its accepted entries in every layer with one gather and one copy (``move``) rather than two per
    layer. Layers whose entries have another shape, dtype or device keep buffers of their own."""

    def __init__(self) -> None:
        self.data: torch.Tensor | None = None
        self.layers: list[BufferedLayer] = []
        self._slots: tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]] | None = None  # (data, keys, values)
        # ``expose`` sets no layer: it counts (``epoch``) and records ``length``; while ``following`` (no layer's
        # keys or values set since), each layer makes its views of the last expose when they are read (a pass's 60
        # views made and set at once cost ~0.2 ms on a cold cache, and the next pass reads none of them)
        self.epoch, self.length, self.following = 0, 0, False

    def layer(self) -> BufferedLayer:
        """A new BufferedLayer whose buffers live here."""
        layer = BufferedLayer()
        layer.arena = self
        layer._index = len(self.layers)
        self.layers.append(layer)
        return layer

    @property
    def capacity(self) -> int:
        return 0 if self.data is None else self.data.shape[-2]

    def fits(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """Entries of this shape (batch, heads, dim), dtype and device can live here."""
        batch, heads, _, dim = key_states.shape
        if value_states.shape[-1] != dim or value_states.dtype != key_states.dtype:
            return False
        data = self.data
        return data is None or (data.shape[2:4] == (batch, heads) and data.shape[-1] == dim
                                and data.dtype == key_states.dtype and data.device == key_states.device)

    def grow(self, key_states: torch.Tensor, needed: int) -> None:
        """Room for ``needed`` entries in every layer (by half more, as ``BufferedLayer``), the entries kept."""
        capacity = needed + max(needed // 2, 64)
        batch, heads, _, dim = key_states.shape
        data = huge_empty((len(self.layers), 2, batch, heads, capacity, dim), key_states.dtype, key_states.device)
        if self.data is not None:
            data.narrow(4, 0, self.capacity).copy_(self.data)
        self.data, self._slots = data, None  # the old tensor's buffers let go with it
        for index, layer in enumerate(self.layers):
            layer.adopt(data[index, 0], data[index, 1])

    def slot(self, layer: BufferedLayer) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s key and value buffers (B, H, capacity, D)."""
        index = self.layers.index(layer)
        return self.data[index, 0], self.data[index, 1]

    def buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's key and value buffers (B, H, capacity, D), made once per ``data`` (a pass writes its entries
        into them in place: ``specfamily.runtime.native_layers``)."""
        data = self.data
        if self._slots is None or self._slots[0] is not data:
            views = data.view(-1, *data.shape[2:]).unbind(0)  # keys, values of each layer
            self._slots = (data, list(views[0::2]), list(views[1::2]))
        return self._slots[1], self._slots[2]

    def cut(self, length: int) -> bool:
        """Every layer's ``keys``/``values``: its first ``length`` entries (``expose``); False (nothing done) where a
        layer holds fewer. Needs every layer's ``keys`` to be its own view of this arena (``shared_arena``)."""
        held = self.length if self.following else min(layer.keys.shape[-2] for layer in self.layers)
        if length > held:
            return False
        self.expose(length)
        return True

    def expose(self, length: int) -> None:
        """Every layer's ``keys``/``values``: its buffers' first ``length`` entries (at most ``capacity``), made when
        a layer's are next read (``BufferedLayer.keys``); their ``_own`` with them."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"expose: {length} entries do not fit the arena's capacity {self.capacity}")
        self.epoch, self.length, self.following = self.epoch + 1, length, True

    def views(self, index: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s keys and values: its buffers' first ``length`` entries (B, H, length, D) each."""
        data = self.data
        return data[index, 0].narrow(2, 0, length), data[index, 1].narrow(2, 0, length)

    def move(self, base: int, src: torch.Tensor) -> None:
        """Every layer's entries at ``src`` (k,) to ``base .. base + k - 1`` (``src`` ascending, each >= its target)."""
        data = self.data
        data.narrow(4, base, src.numel()).copy_(data.index_select(4, src))

    def move_rows(self, base: int, src: Sequence[int]) -> None:
        """``move`` for positions on the host (a tree's accepted path: a few): one copy per entry, in ascending order,
        so no entry is overwritten before it is read (each target lies below every later source); no index tensor."""
        data = self.data
        for offset, position in enumerate(src):
            data.narrow(4, base + offset, 1).copy_(data.narrow(4, position, 1))


def shared_arena(layers) -> KVArena | None:
    """The arena every one of ``layers`` keeps its entries in, as its own views (``move`` then covers them all), or
    None."""
    arena = getattr(layers[0], "arena", None) if layers else None
    if arena is None or arena.data is None or len(arena.layers) != len(layers):
        return None
    following = arena.following  # every layer's views are the last expose's (in the arena, its own)
    for layer, mine in zip(layers, arena.layers, strict=True):
        if layer is not mine or not (following or (layer.owned and layer.in_arena)):
            return None
    return arena
