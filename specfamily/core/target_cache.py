"""The target's checks on a pass's inputs and its cache moves after verification (specfamily.core.target's).

A draft's ids must lie in the vocabulary, an accepted path must run from the root; a commit keeps the accepted rows
(``gather_tail``: a tree's rewrite) and drops the rest (``truncate``: a crop), on the shared arena when the layers
have one (runtime.kv_cache), layer by layer otherwise; ``keep_path`` does both for a commit.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specfamily.runtime.kv_cache import BufferedLayer, shared_arena


def check_path(accepted: list[int], parents: tuple[int, ...]) -> None:
    """``accepted`` must be a path from the root down the last draft."""
    previous = -1
    for node in accepted:
        if not 0 <= node < len(parents) or parents[node] != previous:
            raise ValueError(f"accepted nodes {accepted} are not a path from the root of the draft {list(parents)}")
        previous = node


def check_draft_tokens(tokens: torch.Tensor, vocab_size: int) -> None:
    """Draft token ids must lie in the target's vocabulary (an embedding lookup would fail, or read garbage)."""
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"draft tokens must be integer ids, got dtype {tokens.dtype}")
    if not tokens.numel():
        return
    if tokens.device.type == "cpu" and tokens.numel() <= 256:  # a draft's few ids: read on the host, no tensor ops
        ids = tokens.tolist()
        low, high = min(ids), max(ids)
    else:
        low, high = (int(v) for v in torch.aminmax(tokens))
    if low >= 0 and high < vocab_size:  # the offending id is searched for only when there is one
        return
    bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
    if bad.numel():
        raise ValueError(f"draft token id {int(bad[0])} is outside the target's vocabulary [0, {vocab_size})")


def gather_tail(cache: DynamicCache, base: int, src: torch.Tensor) -> None:
    """Move the cache entries at ``src`` (k,) to ``base .. base + k - 1`` in every layer.

    A cache spread over several devices (``device_map="auto"``) is indexed on each layer's own device.
    """
    arena = shared_arena(cache.layers)
    if arena is not None and arena.data.device == src.device:
        arena.move(base, src)  # every layer in one gather and one copy
        return
    k = src.numel()
    on_device = {src.device: src}
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        device = layer.keys.device
        if device not in on_device:
            on_device[device] = src.to(device, non_blocking=True)
        index = on_device[device]
        layer.keys[:, :, base : base + k] = layer.keys.index_select(2, index)
        layer.values[:, :, base : base + k] = layer.values.index_select(2, index)


def keep_path(cache: DynamicCache, base: int, src: list[int], length: int | None) -> None:
    """A commit's cache moves: the entries at ``src`` (ascending host positions, each >= its target) to ``base ..``,
    then (``length`` not None) every entry at or after ``length`` dropped. On a shared arena both in one look at the
    layers (``shared_arena``) and the moves without an index tensor; else as ``gather_tail`` and ``truncate``."""
    arena = shared_arena(cache.layers)
    if arena is not None:
        if src:
            arena.move_rows(base, src)
        if length is None or arena.cut(length):
            return
    elif src:
        gather_tail(cache, base, torch.tensor(src, dtype=torch.long))
    if length is not None:
        truncate(cache, length)


def truncate(cache: DynamicCache, length: int) -> None:
    """Drop every cache entry at or after ``length`` in every layer (a view's length change: nothing is copied)."""
    arena = shared_arena(cache.layers)
    if arena is not None and arena.cut(length):
        return
    for layer in cache.layers:
        if type(layer) is BufferedLayer:
            layer.cut(length)
            continue
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]
