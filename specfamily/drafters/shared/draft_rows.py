"""The batch draft cache kept across batched proposals: one row per request, so a proposal copies nothing twice.

Feature drafting in batches (``batched_features``) runs the draft layer over a ragged
:class:`~specfamily.runtime.batch_cache.BatchCache`. :class:`DraftRows` keeps that cache from one proposal to the next:
a request's :class:`~specfamily.drafters.shared.feature_drafting.FeatureState` is *adopted* the first time it drafts in
a batch (its own committed pairs copied into a free row once, its own cache emptied), and from then on its row is its
cache: the catch-up writes the new pairs there, the draft's entries are dropped by setting the row's length back to
the committed pairs (``FeatureState.real``), nothing is copied or concatenated per pass. A state that proposes alone
again (batch-1 ``propose``) is checked in first: its row's pairs copied back into its own cache, the row freed.

Rows are owned by state objects (weakly: a row whose request is gone is free again); ``end`` and ``begin`` of the
drafter release its row. A copy of an adopted state (``slot_copy``) shares the row's owner's pool and reads the row
when it checks in, without freeing it.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch
from transformers import DynamicCache

from specfamily.runtime.batch_cache import BatchCache, SlotLayer

__all__ = ["DraftRows", "HeldState"]


class HeldState(Protocol):
    """What the pool reads and sets of a request's state (``feature_drafting.FeatureState``; a protocol here so the
    two modules do not import each other)."""

    cache: DynamicCache
    real: int
    held: DraftRows | None
    row: int

FIRST_ROWS = 4  # rows the pool starts with; it doubles when every row is owned


class DraftRows:
    """A one-layer :class:`BatchCache` whose rows belong to requests across proposals."""

    def __init__(self) -> None:
        self.cache = _one_layer(FIRST_ROWS, 0)
        self.owners: list[weakref.ref | None] = [None] * FIRST_ROWS

    def rows_for(self, states: list[HeldState]) -> list[int]:
        """Each state's row, adopting (one copy of its own cache) every state that holds none here."""
        for state in states:
            if not self.owns(state):
                self.adopt(state)
        return [state.row for state in states]

    def owns(self, state: HeldState) -> bool:
        return state.held is self and self._owner(state.row) is state

    def adopt(self, state: HeldState) -> None:
        """Give ``state`` a row holding its committed pairs; its own cache is emptied (the row is its cache now)."""
        if state.held is not None:
            state.held.check_in(state)  # held by another pool, or a copy of a state that is: its pairs first
        row = self._free_row()
        real = self.cache.lengths[row] = state.real
        if real:
            own = state.cache.layers[0]
            layer = self._fitted(own.keys, own.values, real)
            layer.key_buffer[row, :, :real] = own.keys[0, :, :real]
            layer.value_buffer[row, :, :real] = own.values[0, :, :real]
        self.owners[row] = weakref.ref(state)
        state.held, state.row, state.cache = self, row, DynamicCache()

    def check_in(self, state: HeldState) -> None:
        """Copy ``state``'s committed pairs from its row back into its own cache (before a batch-1 proposal); free
        the row when ``state`` owns it (a copy of the owner leaves it to the owner)."""
        owner = self._owner(state.row)
        if owner is None:
            raise RuntimeError(f"draft row {state.row} was released: the state's committed pairs are gone")
        layer, real = self.cache.layers[0], state.real
        state.cache = DynamicCache()
        if real:
            keys = layer.key_buffer[state.row : state.row + 1, :, :real].clone()
            state.cache.update(keys, layer.value_buffer[state.row : state.row + 1, :, :real].clone(), 0)
        self.release(state)
        state.held, state.row = None, -1

    def release(self, state: HeldState) -> None:
        """Free ``state``'s row if it owns one here (its request ended, or it starts another)."""
        if self.owns(state):
            self.owners[state.row] = None
            self.cache.lengths[state.row] = 0

    def drop_drafts(self, states: list[HeldState]) -> None:
        """After a proposal: each row keeps its committed pairs only (the draft's entries are past them)."""
        for state in states:
            self.cache.lengths[state.row] = state.real

    def _owner(self, row: int) -> HeldState | None:
        ref = self.owners[row] if 0 <= row < len(self.owners) else None
        return None if ref is None else ref()

    def _free_row(self) -> int:
        """A row no live state owns, doubling the pool when there is none."""
        for row in range(len(self.owners)):
            if self._owner(row) is None:
                self.owners[row] = None
                return row
        rows = len(self.owners)
        grown = _one_layer(2 * rows, self.cache.capacity)
        grown.lengths[:rows] = self.cache.lengths
        old, new = self.cache.layers[0], grown.layers[0]
        if old.key_buffer is not None:
            new.key_buffer = old.key_buffer.new_zeros(2 * rows, *old.key_buffer.shape[1:])
            new.value_buffer = old.value_buffer.new_zeros(2 * rows, *old.value_buffer.shape[1:])
            new.key_buffer[:rows], new.value_buffer[:rows] = old.key_buffer, old.value_buffer
        self.cache = grown
        self.owners += [None] * rows
        return rows

    def _fitted(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> SlotLayer:
        """The layer with buffers like ``keys``/``values`` (1, heads, L, D) holding at least ``length`` a row."""
        layer, cache = self.cache.layers[0], self.cache
        held = 0 if layer.key_buffer is None else layer.key_buffer.shape[2]
        if held >= length:
            return layer
        cache.capacity = max(cache.capacity, length + max(length // 2, 64))
        grown = [t.new_zeros(cache.slots, t.shape[1], cache.capacity, t.shape[-1]) for t in (keys, values)]
        if layer.key_buffer is not None:
            grown[0][:, :, :held], grown[1][:, :, :held] = layer.key_buffer, layer.value_buffer
        layer.key_buffer, layer.value_buffer = grown
        return layer

def _one_layer(rows: int, capacity: int) -> BatchCache:
    cache = BatchCache(None, rows, capacity)
    cache.cache.layers = [SlotLayer(cache)]
    return cache
