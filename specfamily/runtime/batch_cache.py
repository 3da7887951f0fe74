"""The KV cache of batched decoding: one preallocated buffer per layer for every batch slot, ragged lengths.

Each layer holds keys and values as (slots, heads, capacity, D) buffers; slot b holds ``lengths[b]`` committed
entries at its start. A pass over a contiguous range of slots writes each slot's fed entries at its own length (rows
past a slot's fed tokens are padding, written past its length and never read: the caller's mask hides them) and reads
every slot of the range up to the longest. Rollback is per slot and moves only the accepted entries; the buffers grow
(by half) when a pass would run past them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specfamily.runtime.huge_pages import huge_empty

__all__ = ["BatchCache", "PassPlan", "SlotLayer"]


@dataclass(frozen=True)
class PassPlan:
    """Where one pass writes: slots ``lo:hi``, each fed row j of slot b at ``lengths[b] + j``."""

    lo: int
    hi: int
    index: torch.Tensor  # (hi - lo, 1, F, 1) long: write positions
    extent: int  # keys read per slot: max length over the range + F


class SlotLayer(DynamicLayer):
    """One layer of a :class:`BatchCache`: ``update`` scatters a pass's keys and values into its slots' rows."""

    def __init__(self, owner: BatchCache) -> None:
        super().__init__()
        self.owner = owner
        self.key_buffer: torch.Tensor | None = None  # (slots, heads, capacity, D)
        self.value_buffer: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states (B, heads, F, D) for the plan's slots -> their keys and values (B, heads, extent, D)."""
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("a batched pass needs BatchCache.begin_pass() first")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._fit(key_states, value_states)
        heads, width = key_states.shape[1], key_states.shape[-1]
        keys, values = self.key_buffer[plan.lo : plan.hi], self.value_buffer[plan.lo : plan.hi]
        keys.scatter_(2, plan.index.expand(-1, heads, -1, width), key_states)
        values.scatter_(2, plan.index.expand(-1, heads, -1, value_states.shape[-1]), value_states)
        self.keys, self.values = keys[:, :, : plan.extent], values[:, :, : plan.extent]
        return self.keys, self.values

    def ensure(self, heads: int, dim: int, dtype: torch.dtype,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers (slots, heads, capacity, D), allocated or grown to the owner's capacity (a
        pass that writes them itself: ``specfamily.runtime.batch_lean.slot_forward``)."""
        probe = torch.empty(1, heads, 0, dim, dtype=dtype, device=device)
        if not self.is_initialized:
            self.lazy_initialization(probe, probe)
        self._fit(probe, probe)
        return self.key_buffer, self.value_buffer

    def _fit(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the buffers on first use, grow them when the plan runs past their capacity."""
        capacity = self.owner.capacity
        if self.key_buffer is not None and self.key_buffer.shape[2] >= capacity:
            return
        slots, heads = self.owner.slots, key_states.shape[1]
        keys = huge_empty((slots, heads, capacity, key_states.shape[-1]), key_states.dtype, key_states.device).zero_()
        values = huge_empty((slots, heads, capacity, value_states.shape[-1]), value_states.dtype,
                            value_states.device).zero_()
        if self.key_buffer is not None:
            held = self.key_buffer.shape[2]
            keys[:, :, :held], values[:, :, :held] = self.key_buffer, self.value_buffer
        self.key_buffer, self.value_buffer = keys, values

    def get_seq_length(self) -> int:
        return self.owner.plan.extent if self.owner.plan is not None else max(self.owner.lengths, default=0)


class BatchCache:
    """Per-layer slot buffers and each slot's committed length (host ints), as a transformers ``DynamicCache``."""

    def __init__(self, config, slots: int, capacity: int = 256) -> None:
        self.slots, self.capacity = slots, capacity
        self.lengths = [0] * slots
        self.plan: PassPlan | None = None
        self.config = config
        self.cache = DynamicCache(config=config)
        self.cache.layers = [SlotLayer(self) for _ in self.cache.layers]

    @property
    def layers(self) -> list[SlotLayer]:
        return self.cache.layers

    def plan_pass(self, lo: int, hi: int, fed: int, device: torch.device) -> PassPlan:
        """Plan a pass of ``fed`` rows per slot over slots ``lo:hi``, growing the capacity when needed."""
        lengths = torch.tensor(self.lengths[lo:hi], dtype=torch.long)
        extent = int(lengths.max()) + fed
        if extent > self.capacity:
            self.capacity = extent + max(extent // 2, 64)
        index = (lengths[:, None] + torch.arange(fed)).view(hi - lo, 1, fed, 1)
        index = index.to(device, non_blocking=True)  # queued: staged from pageable memory, no wait for the stream
        self.plan = PassPlan(lo, hi, index, extent)
        return self.plan

    def buffers(self, heads: int, dim: int, dtype: torch.dtype,
                device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's key buffers and value buffers (``heads`` key/value heads ``dim`` wide), allocated or grown
        to the capacity (``SlotLayer.ensure``)."""
        pairs = [layer.ensure(heads, dim, dtype, device) for layer in self.layers]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def end_pass(self) -> None:
        self.plan = None

    def keep(self, slot: int, base: int, accepted: list[int]) -> None:
        """After a pass: slot keeps its entries up to ``base`` (its length plus the pending tokens) and the accepted
        draft nodes (node i was written at ``base + i``), moved to follow ``base``."""
        self.keep_all([(slot, base, accepted)])

    def keep_all(self, passes: Sequence[tuple[int, int, list[int]]]) -> None:
        """:meth:`keep` for each (slot, base, accepted) of a pass, the positions of every slot's moved entries
        reaching the device in one copy."""
        moving = []  # (slot, base, the prefix already in place, accepted)
        for slot, base, accepted in passes:
            kept = next((i for i, node in enumerate(accepted) if node != i), len(accepted))
            if kept < len(accepted):
                moving.append((slot, base, kept, accepted))
            self.lengths[slot] = base + len(accepted)
        if not moving:
            return
        device = self.layers[0].key_buffer.device
        sources = torch.tensor([base + node for _, base, kept, accepted in moving for node in accepted[kept:]],
                               dtype=torch.long).to(device, non_blocking=True)
        for (slot, base, kept, accepted), src in zip(
                moving, sources.split([len(a) - kept for _, _, kept, a in moving]), strict=True):
            for layer in self.layers:
                for buffer in (layer.key_buffer, layer.value_buffer):
                    row = buffer[slot]  # (heads, capacity, D)
                    row[:, base + kept : base + len(accepted)] = row.index_select(1, src)

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s committed entries into slot ``dst`` (retiring ``dst`` keeps the live slots packed)."""
        length = self.lengths[src]
        for layer in self.layers:
            if layer.key_buffer is None:
                continue
            layer.key_buffer[dst, :, :length] = layer.key_buffer[src, :, :length]
            layer.value_buffer[dst, :, :length] = layer.value_buffer[src, :, :length]
        self.lengths[dst] = length

    def slot_view(self, slot: int) -> DynamicCache:
        """A batch-1 ``DynamicCache`` over slot's committed entries (views: appending to it concatenates into new
        tensors and leaves the buffers alone), for a drafter that runs the target's layers on its own request."""
        view = DynamicCache(config=self.config)
        length = self.lengths[slot]
        for layer, source in zip(view.layers, self.layers, strict=False):
            if source.key_buffer is None or length == 0:
                continue
            layer.lazy_initialization(source.key_buffer, source.value_buffer)
            layer.keys = source.key_buffer[slot : slot + 1, :, :length]
            layer.values = source.value_buffer[slot : slot + 1, :, :length]
        return view

    def bytes_per_slot(self) -> int:
        """Bytes the buffers hold per slot (at the current capacity)."""
        total = sum(b.numel() * b.element_size() for layer in self.layers
                    for b in (layer.key_buffer, layer.value_buffer) if b is not None)
        return total // self.slots
