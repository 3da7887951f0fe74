"""One target forward for many requests: each slot's pending tokens and draft tree, ragged, in one model call.

The batched counterpart of :class:`specfamily.core.target.Target` (whose model, lean forward and checks it reuses).
Slot b's cache holds ``lengths[b]`` committed tokens (every committed token but its root); a pass over slots
``lo:hi`` feeds each slot's pending tokens (the root last) then its draft nodes, padded on the right to the longest
slot. Positions and the additive 4D mask are per slot: a fed token sees its slot's cached entries and, among the
fed ones, what :func:`specfamily.core.tree_mask.local_mask` lets it see; a padding row sees only itself. Where the
lean forward runs and a pass has padding (ragged drafts), its products run on the fed rows only
(:func:`specfamily.runtime.batch_lean.packed_forward`): a slot that drafts nothing costs its one row, and ``rows``
says how many rows the latest pass computed. Where the lean forward has its C++ layer loop and attends with the
attention kernel (``matmul=stream``), a pass whose every slot a batch-1 pass would attend with the kernel (a cached
prefix or one fed row, at most ``MAX_ROWS`` rows) runs as one call of that loop
(:func:`specfamily.runtime.batch_lean.slot_forward`): no padding, no 4D mask, each slot attending over its own cache
row, and every fed row's logits bit-identical to its batch-1 pass's. If that call fails, one warning names why and the
target's batched passes take the padded or packed path from then on (:func:`native_failure`), the failed pass's too:
the call wrote only entries past each slot's kept length, which the fallback's pass writes again.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfamily.core import host
from specfamily.core.target import Target, TargetOutput
from specfamily.core.target_cache import check_draft_tokens, check_path
from specfamily.core.tree_mask import TreeLayout, tree_layout
from specfamily.core.types import Draft
from specfamily.runtime.attention import MAX_ROWS
from specfamily.runtime.batch_cache import BatchCache
from specfamily.runtime.batch_lean import SlotRows, packed_forward, slot_forward
from specfamily.runtime.kernel import short_error

__all__ = ["BatchTarget", "SlotFeed", "native_failure"]

logger = logging.getLogger(__name__)

_LAYOUTS_KEPT = 64
_FAILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # native layer loop -> why its batched call failed


def native_failure(target: Target) -> str | None:
    """Why ``target``'s batched passes no longer run as one native call (its ``forward_slots`` failed), or None."""
    lean = target.lean
    native = None if lean is None else lean.native
    return None if native is None else _FAILED.get(native)


@dataclass(frozen=True)
class SlotFeed:
    """What one slot feeds in a pass: pending tokens (m,), the root last, and a draft (possibly empty)."""

    pending: torch.Tensor  # (m,) long
    draft: Draft


def _checked(tokens: list[torch.Tensor], vocab_size: int, device: torch.device) -> list[torch.Tensor]:
    """Every slot's draft ids checked against the vocabulary (those on an accelerator together: one read for all)
    and on ``device`` (those on the host in one copy: ``host.to_device``)."""
    away = [ids for ids in tokens if ids.numel() and ids.device.type != "cpu"]
    for ids in tokens:
        if ids.numel() and ids.device.type == "cpu":
            check_draft_tokens(ids, vocab_size)
    if away:
        check_draft_tokens(torch.cat(away) if len(away) > 1 else away[0], vocab_size)
    return host.to_device(tokens, device)


def _roots_alone(roots: list[torch.Tensor], index: torch.Tensor, extent: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, positions, mask) of a pass where every slot feeds one token, its root, in a few tensor ops whatever the
    number of slots (slot by slot each took several, each a kernel launch on an accelerator): the same values as
    :meth:`BatchTarget._place` writes. ``index``: the cache plan's (B, 1, 1, 1) write positions, each slot's length:
    its root's position, and the last key it sees (its cached entries and itself)."""
    positions = index.view(-1, 1)
    keys = torch.arange(extent, device=index.device).view(1, 1, 1, extent)
    mask = torch.full((len(roots), 1, 1, extent), torch.finfo(dtype).min, dtype=dtype, device=index.device)
    return torch.cat(roots).view(-1, 1), positions, mask.masked_fill_(keys <= index, 0)


class BatchTarget:
    """A :class:`Target`'s model run over batch slots, with a :class:`BatchCache` and per-slot rollback."""

    def __init__(self, target: Target, slots: int, capacity: int = 256) -> None:
        self.target = target
        self.cache = BatchCache(target.model.config, slots, capacity)
        self._layouts: OrderedDict[tuple, TreeLayout] = OrderedDict()
        self._last: dict[int, tuple[int, tuple[int, ...]]] = {}  # slot -> (base, parents) until committed
        self.rows = 0  # rows the latest pass ran through the model's products (padding included when not packed)

    @property
    def lengths(self) -> list[int]:
        return self.cache.lengths

    @torch.inference_mode()
    def forward(self, lo: int, feeds: Sequence[SlotFeed], features: bool | tuple[int, ...] = False,
                ) -> list[TargetOutput]:
        """Score slots ``lo : lo + len(feeds)`` in one model call: one TargetOutput per slot (logits (n + 1, V),
        row 0 at the root; features (m + n, H) of its fed positions when asked)."""
        if self._last:
            raise RuntimeError("commit() every slot of the previous pass before the next one")
        target, device, dtype = self.target, self.target.device, self.target.dtype
        if isinstance(features, tuple):
            target.check_feature_layers(features)
        parents = [tuple(feed.draft.parents.tolist()) for feed in feeds]
        drafted = _checked([feed.draft.tokens for feed in feeds], target.vocab_size, device)
        m = [feed.pending.numel() for feed in feeds]
        fed = [mi + len(tree) for mi, tree in zip(m, parents, strict=True)]
        width, hi = max(fed), lo + len(feeds)
        plan = self.cache.plan_pass(lo, hi, width, device)
        lengths = self.cache.lengths[lo:hi]
        if self._native(lengths, fed, parents):
            outputs = self._slots(lo, feeds, drafted, parents, lengths, m, features)
            if outputs is not None:
                return outputs
            plan = self.cache.plan_pass(lo, hi, width, device)  # the failed call ended its pass: the fallback's
        if width == 1:  # every slot feeds its root alone (a pass that drafts nothing): built for all slots at once
            ids, positions, mask = _roots_alone([feed.pending for feed in feeds], plan.index, plan.extent, dtype)
        else:
            ids = torch.zeros(len(feeds), width, dtype=torch.long, device=device)
            positions = torch.zeros(len(feeds), width, dtype=torch.long, device=device)
            mask = torch.full((len(feeds), 1, width, plan.extent), torch.finfo(dtype).min, dtype=dtype, device=device)
            for b, (feed, tree) in enumerate(zip(feeds, parents, strict=True)):
                self._place(b, feed.pending, drafted[b], tree, lengths[b], m[b], width, (ids, positions, mask))
        if self._packs(len(feeds), width, sum(fed)):
            return self._packed(lo, feeds, parents, lengths, m, fed, (ids, positions, mask), features)
        keep = width - (min(m) - 1)  # from the earliest root to the last row
        try:
            logits, hidden = self._call(ids, positions, mask, keep, features)
        except BaseException:
            self.cache.end_pass()  # entries past each slot's length are never read: nothing to undo
            raise
        self.cache.end_pass()
        self.rows = len(feeds) * width
        outputs = []
        for b in range(len(feeds)):
            first = m[b] - 1 - (width - keep)
            rows = logits[b, first : first + len(parents[b]) + 1]  # (n + 1, V)
            outputs.append(TargetOutput(rows, hidden[b, : fed[b]] if features else None))
            self._last[lo + b] = (lengths[b] + m[b], parents[b])
        return outputs

    def _packs(self, batch: int, width: int, rows: int) -> bool:
        """Whether a pass runs packed: the lean forward is ready and the pass has padding."""
        lean = self.target.lean
        return batch > 1 and width > 1 and rows < batch * width and lean is not None and lean.ready()

    def _native(self, lengths: list[int], fed: list[int], parents: list[tuple[int, ...]]) -> bool:
        """Whether a pass runs as one call of the C++ layer loop (:func:`slot_forward`): the lean forward is ready
        with its native loop and attention kernel, and every slot's rows are ones a batch-1 pass attends with the
        kernel: at most ``MAX_ROWS``, and not a prompt of several tokens over an empty cache (sdpa's causal pass)."""
        lean = self.target.lean
        if lean is None or lean.native is None or max(fed) > MAX_ROWS or lean.native in _FAILED:
            return False
        if any(length == 0 and f > 1 and not tree for length, f, tree in zip(lengths, fed, parents, strict=True)):
            return False
        return lean.native.slots_ready(lean) and lean.ready()

    def _slots(self, lo: int, feeds: Sequence[SlotFeed], drafted: list[torch.Tensor], parents: list[tuple[int, ...]],
               lengths: list[int], m: list[int], features: bool | tuple[int, ...]) -> list[TargetOutput] | None:
        """The pass through :func:`slot_forward`: each slot's logits (root and draft rows), its fed rows' features;
        None where the native call failed (one warning, and the other paths for good: :func:`native_failure`)."""
        device = self.target.device
        ids, positions, slots, heads, first = [], [], [], [], 0
        for b, (feed, tree) in enumerate(zip(feeds, parents, strict=True)):
            layout, f = self._layout(m[b], tree), m[b] + len(tree)
            ids.append(feed.pending.to(device))
            if tree:
                ids.append(drafted[b])
            positions.append(layout.offsets + lengths[b])
            slots.append(SlotRows(lo + b, lengths[b], f, layout.visible(lengths[b]) if f > 1 else None))
            heads.extend(range(first + m[b] - 1, first + f))
            first += f
        try:
            logits, hidden = slot_forward(self.target.lean, torch.cat(ids), torch.cat(positions), self.cache, slots,
                                          torch.tensor(heads, device=device), features)
        except Exception as error:  # noqa: BLE001 - any failure: the padded or packed path from now on, this pass's too
            # it wrote at most each slot's fed entries, past its kept length: the fallback's pass writes them again
            self.cache.end_pass()
            _FAILED[self.target.lean.native] = reason = short_error(error)
            logger.warning("the batched native layer loop failed, running the batched Python passes: %s", reason)
            return None
        except BaseException:
            self.cache.end_pass()  # entries past each slot's length are never read: nothing to undo
            raise
        self.cache.end_pass()
        self.rows = first
        outputs, k, start = [], 0, 0
        for b, rows in enumerate(slots):
            n = len(parents[b]) + 1
            outputs.append(TargetOutput(logits[k : k + n], hidden[start : start + rows.count] if features else None))
            k, start = k + n, start + rows.count
            self._last[lo + b] = (lengths[b] + m[b], parents[b])
        return outputs

    def _packed(self, lo: int, feeds: Sequence[SlotFeed], parents: list[tuple[int, ...]], lengths: list[int],
                m: list[int], fed: list[int], padded: tuple, features: bool | tuple[int, ...]) -> list[TargetOutput]:
        """The pass through :func:`packed_forward`: each slot's logits (root and draft rows), its fed rows' features."""
        ids, positions, mask = padded
        width, device = ids.shape[1], ids.device
        rows = [b * width + j for b, f in enumerate(fed) for j in range(f)]
        starts = [sum(fed[:b]) for b in range(len(fed))]  # each slot's first packed row
        heads = [s + j for s, mb, f in zip(starts, m, fed, strict=True) for j in range(mb - 1, f)]
        try:
            index = torch.tensor(rows + heads).to(device, non_blocking=True)  # fed rows, scored rows: one copy
            logits, hidden = packed_forward(self.target.lean, ids, positions, mask, self.cache.cache,
                                            index[: len(rows)], index[len(rows) :], features,
                                            [(f, length + f) for length, f in zip(lengths, fed, strict=True)])
        except BaseException:
            self.cache.end_pass()
            raise
        self.cache.end_pass()
        self.rows = len(rows)
        outputs, k = [], 0
        for b, start in enumerate(starts):
            n = len(parents[b]) + 1
            outputs.append(TargetOutput(logits[k : k + n], hidden[start : start + fed[b]] if features else None))
            k += n
            self._last[lo + b] = (lengths[b] + m[b], parents[b])
        return outputs

    def _place(self, b: int, pending: torch.Tensor, tokens: torch.Tensor, tree: tuple[int, ...], length: int, m: int,
               width: int, padded: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        """Write slot row b's ids, positions and mask (cached entries, its local tree mask, padding rows):
        ``pending`` its root (or prompt), ``tokens`` its draft's ids on the device."""
        ids, positions, mask = padded
        layout = self._layout(m, tree)
        f = m + len(tree)
        ids[b, :m] = pending
        if tree:
            ids[b, m:f] = tokens
        positions[b, :f] = layout.offsets + length
        positions[b, f:] = length
        mask[b, 0, :f, :length] = 0
        mask[b, 0, :f, length : length + f] = layout.local
        pad = torch.arange(f, width, device=mask.device)
        mask[b, 0, pad, length + pad] = 0  # a padding row sees itself (no all-masked row, no NaN)

    def _call(self, ids, positions, mask, keep: int, features: bool | tuple[int, ...]):
        """(logits (B, keep, V), hidden (B, F, H) or None): the target's lean forward, else its model."""
        target, cache = self.target, self.cache.cache
        if target.lean is not None and target.lean.ready():
            return target.lean(ids, positions, mask, cache, keep, features)
        extra = {"logits_to_keep": keep} if target._keep_logits else {}
        out = target.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                           output_hidden_states=bool(features), **{target._cache_kw: cache}, **extra)
        logits = out.logits[:, -keep:]
        if isinstance(features, tuple):
            return logits, torch.cat([out.hidden_states[i] for i in features], dim=-1)
        return logits, (out.hidden_states[-1] if features else None)

    def commit(self, slot: int, accepted_nodes: Sequence[int]) -> None:
        """Keep in slot's cache its pending tokens of the last pass and the accepted nodes (root down)."""
        self.commit_all({slot: accepted_nodes})

    @torch.inference_mode()
    def commit_all(self, accepted: dict[int, Sequence[int]]) -> None:
        """:meth:`commit` of every slot given (slot -> its accepted nodes), their moved entries in one copy."""
        for slot, nodes in accepted.items():  # every path checked before any slot's cache moves
            if slot not in self._last:
                raise RuntimeError(f"slot {slot} has no forward to commit")
            check_path(list(nodes), self._last[slot][1])
        self.cache.keep_all([(slot, self._last.pop(slot)[0], list(nodes)) for slot, nodes in accepted.items()])

    @torch.inference_mode()
    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s cache into slot ``dst`` (keeping the live slots packed when ``dst`` retires)."""
        self.cache.move(src, dst)

    def reset_slot(self, slot: int) -> None:
        """An empty cache for a request admitted into ``slot``."""
        self.cache.lengths[slot] = 0

    def _layout(self, m: int, parents: tuple[int, ...]) -> TreeLayout:
        key = (m, parents)
        layout = self._layouts.get(key)
        if layout is None:
            layout = tree_layout(m, parents, self.target.dtype, self.target.device)
            if m + len(parents) <= 64:
                self._layouts[key] = layout
                if len(self._layouts) > _LAYOUTS_KEPT:
                    self._layouts.popitem(last=False)
        return layout
