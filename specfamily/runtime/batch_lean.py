"""The lean forward over a ragged batch without computing its padding: every product runs on the fed rows only.

A batched pass feeds slot b ``fed[b]`` rows, padded on the right to the longest slot. On a CPU each row a weight
matrix multiplies costs compute, so with ragged draft lengths the padding would cost as much as a drafted row, and a
slot that drafts nothing would pay for the others' drafts. :func:`packed_forward` runs the embedding, the norms, every
projection, the MLP and the LM head on the N fed rows packed together (1, N, H), and spreads only the queries, keys
and values into the padded (B, heads, W, D) layout that the rope, the batched cache and sdpa take (a padding row's
query, key and value are zeros; the mask keeps every fed row from seeing one). Each fed row meets the same values in
the same order as in :class:`specfamily.runtime.lean.LeanLlama`'s padded pass, so under a batch-invariant matmul kind
(``stream``) its logits are bit-identical to that pass's where sdpa gives a slot's rows over its own keys the bits it
gives them over the padded keys with the rest masked (torch's CPU kernel does on some CPUs, not on others: their last
bits then differ, docs/batching.md); under BLAS kinds the products' row counts differ, so the last bits may.

:func:`slot_forward` is the pass without any padding where the C++ layer loop and the attention kernel run: one
native call for every layer, each slot's rows attending over its own cache row, bit-identical to batch-1 passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from specfamily.runtime.lean import Attend, LeanLayer, LeanLlama, plan_attention, rope

__all__ = ["SlotRows", "packed_forward", "slot_forward"]


def packed_forward(
    lean: LeanLlama, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor, cache,
    rows: torch.Tensor, heads: torch.Tensor, features: bool | tuple[int, ...] = False,
    slots: Sequence[tuple[int, int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits (K, V) of the packed rows ``heads``, the fed rows' last hidden state after the norm (N, H) or, for a
    tuple of layer ids, those layers' states concatenated (N, k H), or None).

    ``input_ids``, ``position_ids`` (B, W) padded; ``mask`` (B, 1, W, S) additive; ``rows`` (N,) the fed rows' flat
    indices b * W + j, ascending; ``heads`` (K,) indices into the N packed rows whose logits are wanted. B > 1 and
    W > 1: a pass of one row per slot, or of one slot, has no padding and takes the lean forward itself.
    ``slots`` (B,) each slot's (fed rows, keys: its cached length plus its fed rows): given, each slot attends alone,
    its fed rows over its own keys (no padded queries, no keys past its own), which is what a pass costs when a long
    prompt is fed beside short rows (a newcomer beside the others' roots); else one sdpa over the padded layout.
    """
    batch, width = input_ids.shape
    if batch < 2 or width < 2:
        raise ValueError(f"a packed pass needs several slots of several rows, got ({batch}, {width})")
    hidden = lean._embed(input_ids.reshape(-1).index_select(0, rows))[None]  # (1, N, H)
    cos, sin = rope(lean._rotary, hidden, position_ids)  # (B, 1, W, D)
    attend = plan_attention(mask, width, lean._groups, lean._probe, masked_gqa=lean._linear is not F.linear)
    if lean.rotate is not None:
        attend = replace(attend, rotate=lean.rotate)
    spread = _Spread(rows, batch, width, None if slots is None else list(slots))
    states = []  # transformers' hidden_states, kept only when layer features are asked for
    for layer in lean._layers[: lean._config.num_hidden_layers]:
        if isinstance(features, tuple):
            states.append(hidden)
        hidden = _layer(layer, hidden, cos, sin, attend, cache, spread)
    hidden = lean._norm_fn(hidden, *lean._norm)
    logits = lean._linear(hidden.index_select(1, heads), *lean._head)[0]  # (K, V)
    if isinstance(features, tuple):
        states.append(hidden)
        return logits, torch.cat([states[i] for i in features], dim=-1)[0]
    return logits, (hidden[0] if features else None)


class _Spread:
    """Between the packed rows (1, N, h D) and the padded per-head layout (B, h, W, D)."""

    def __init__(self, rows: torch.Tensor, batch: int, width: int, slots: list[tuple[int, int]] | None = None) -> None:
        self.rows, self.batch, self.width, self.slots = rows, batch, width, slots

    def out(self, x: torch.Tensor, head_dim: int) -> torch.Tensor:
        """(1, N, h D) -> (B, h, W, D), zeros in the padding rows."""
        padded = x.new_zeros(self.batch * self.width, x.shape[-1])
        padded.index_copy_(0, self.rows, x[0])
        return padded.view(self.batch, self.width, -1, head_dim).transpose(1, 2)

    def back(self, x: torch.Tensor) -> torch.Tensor:
        """(B, h, W, D) -> (1, N, h D)."""
        flat = x.transpose(1, 2).reshape(self.batch * self.width, -1)
        return flat.index_select(0, self.rows)[None]


def _layer(layer: LeanLayer, hidden, cos, sin, attend: Attend, cache, spread: _Spread) -> torch.Tensor:
    """``LeanLayer.__call__`` on packed rows (1, N, H): its attention spread over the slots, its MLP block as is."""
    hidden = hidden + _attention(layer, layer.norm(hidden, *layer.norm1), cos, sin, attend, cache, spread)
    return layer.mlp_block(hidden)


def _attention(layer: LeanLayer, x, cos, sin, attend: Attend, cache, spread: _Spread) -> torch.Tensor:
    """``LeanLayer._attention`` with the projections on packed rows and the attention over the padded slots."""
    if attend.pack or attend.causal:
        raise ValueError("a packed pass takes a masked pass of several rows per slot")
    query = spread.out(layer.linear(x, *layer.q), layer.head_dim)  # (B, heads, W, D)
    key = spread.out(layer.linear(x, *layer.k), layer.head_dim)  # (B, kv heads, W, D)
    value = spread.out(layer.linear(x, *layer.v), layer.head_dim)
    query, key = attend.rotate(query, key, cos, sin)
    if cache is not None:
        key, value = cache.update(key, value, layer.index)
    if attend.groups > 1 and not attend.gqa:
        key, value = repeat_kv(key, attend.groups), repeat_kv(value, attend.groups)
    if spread.slots is not None:
        return layer.linear(_by_slot(query, key, value, attend, layer.scaling, spread), *layer.o)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attend.mask, dropout_p=0.0,
                                         scale=layer.scaling, is_causal=False, enable_gqa=attend.gqa)
    return layer.linear(spread.back(out).contiguous(), *layer.o)


def _by_slot(query, key, value, attend: Attend, scale: float, spread: _Spread) -> torch.Tensor:
    """Each slot's fed rows (its first ones in the padded layout) over its own first keys, one sdpa a slot, as packed
    rows (1, N, heads D): the padded layout's attention without its padding (a 700-token prompt beside seven roots
    made every slot attend 700 query rows over the longest slot's keys: several times the prompt's own attention)."""
    outs = []
    for b, (count, extent) in enumerate(spread.slots):
        out = F.scaled_dot_product_attention(
            query[b : b + 1, :, :count], key[b : b + 1, :, :extent], value[b : b + 1, :, :extent],
            attn_mask=attend.mask[b : b + 1, :, :count, :extent], dropout_p=0.0, scale=scale, is_causal=False,
            enable_gqa=attend.gqa)  # (1, heads, count, D)
        outs.append(out[0].transpose(0, 1).reshape(count, -1))
    return torch.cat(outs)[None]


@dataclass(frozen=True)
class SlotRows:
    """One slot's part of a :func:`slot_forward` pass: its slot index, cached entries and fed rows' visibility."""

    slot: int
    length: int  # entries cached before this pass (> 0)
    count: int  # rows fed (>= 1)
    visible: torch.Tensor | None  # (count, length + count) bool, or None: every key (one fed row)


def slot_forward(lean: LeanLlama, input_ids: torch.Tensor, position_ids: torch.Tensor, cache, slots: list[SlotRows],
                 heads: torch.Tensor, features: bool | tuple[int, ...] = False,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A batched pass as one call of the C++ layer loop (``NativeLayers.forward_slots``): every product on the N fed
    rows packed (1, N, H), the rope by each row's position, each slot's keys and values written into its own buffer
    row and its rows attending over that row with the attention kernel. Every row's logits and features are those of
    a batch-1 lean pass over its own request with the same kernel (bit for bit). ``input_ids``, ``position_ids``
    (N,) in the slots' order; ``cache`` a :class:`~specfamily.runtime.batch_cache.BatchCache` whose capacity covers
    the pass (``plan_pass``); ``heads`` (K,) the packed rows whose logits are wanted. Returns as
    :func:`packed_forward`. Call it only where ``lean.native.slots_ready(lean)``."""
    layer = lean._layers[0]
    buffers = cache.buffers(layer.k[0].shape[0] // layer.head_dim, layer.head_dim, layer.q[0].dtype,
                            input_ids.device)
    hidden = lean._embed(input_ids)[None]  # (1, N, H)
    cos, sin = lean._rope(lean._rotary, hidden, position_ids[None])  # (1, 1, N, D)
    count = lean._config.num_hidden_layers
    layer_ids = tuple(sorted({i for i in features if i < count})) if isinstance(features, tuple) else ()
    hidden, kept = lean.native.forward_slots(
        hidden, cos[0, 0].contiguous(), sin[0, 0].contiguous(), buffers, [s.slot for s in slots],
        [s.length for s in slots], [s.count for s in slots], [s.visible for s in slots], layer_ids)
    hidden = lean._norm_fn(hidden, *lean._norm)
    logits = lean._linear(hidden.index_select(1, heads), *lean._head)[0]  # (K, V)
    if isinstance(features, tuple):
        states = dict(zip(layer_ids, kept, strict=True))
        states[count] = hidden
        return logits, torch.cat([states[i] for i in features], dim=-1)[0]
    return logits, (hidden[0] if features else None)
