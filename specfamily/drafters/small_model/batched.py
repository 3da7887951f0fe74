"""small_model in batches: one draft-model forward per draft step for every drafting slot of a batch.

Each slot's drafter keeps its own state as at batch 1 (its runner's KV cache, ``_base``, ``_gamma``), so ``observe``
and a later batch-1 ``propose`` are unchanged. A batched proposal packs the drafting slots' caches into one ragged
:class:`~specfamily.runtime.batch_cache.BatchCache` (per-slot lengths), runs the draft model once per draft step over
every slot still drafting (:class:`~specfamily.core.batch_target.BatchTarget`: per-slot positions and masks), and
appends each slot's new entries to its own cache afterwards. Each slot samples from its own row with its own
generator, in the order its batch-1 ``propose`` would, so its tokens and q are what batch 1 gives up to the float
rounding of a pass of another shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfamily.core.batch_target import BatchTarget, SlotFeed
from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock
from specfamily.core.host import draw
from specfamily.core.sampling import greedy_tokens, warp
from specfamily.core.target import Target
from specfamily.core.types import Draft
from specfamily.drafters.shared.host_drafts import chain_drafts

__all__ = ["CATCH_UP_TOKENS", "propose_small_batch"]

CATCH_UP_TOKENS = 2  # more unseen tokens than a drafted pass leaves (the last draft token and the bonus): a backlog


@dataclass
class _Slot:
    """One drafting slot's proposal in progress."""

    index: int  # position in the caller's lists
    ctx: DecodeContext
    gamma: int
    feed: torch.Tensor  # (m,) the next tokens to feed
    start: int  # the runner's cached length before the proposal
    tokens: list[torch.Tensor] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)
    done: bool = False


def propose_small_batch(drafters: list, ctxs: list[DecodeContext], gammas: list[int], confidence: float = 0.0,
                        ) -> list[Draft]:
    """Each slot's draft (an empty one for gamma 0), drafted in one draft-model forward per step for all slots.

    ``drafters`` are SmallModelDrafter slot copies over one draft model; their runners' caches are read and
    extended as their own ``propose`` would."""
    drafts = [Draft.empty() for _ in drafters]
    live = sorted((i for i, g in enumerate(gammas) if g > 0), key=lambda i: -gammas[i])  # longest drafts first
    if not live:
        return drafts
    runners: list[Target] = [drafters[i].runner for i in live]
    for runner in runners:
        runner.rollback(runner.cached_length)  # the cache holds exactly its committed length
    slots = [_Slot(i, ctxs[i], gammas[i], _feed(ctxs[i], r), r.cached_length) for i, r in zip(live, runners,
                                                                                               strict=True)]
    capacity = max(s.start + s.feed.numel() + s.gamma for s in slots) + 1
    batch = BatchTarget(runners[0], len(slots), capacity)
    _pack(batch, runners)
    clock = device_clock(runners[0].device)
    begin = clock()
    backlog = [s.feed.numel() > CATCH_UP_TOKENS for s in slots]
    if any(backlog):  # as batch 1: the backlog but its last token in a pass of its own (kept out of c)
        _pass(batch, [s.feed[:-1] if late else None for s, late in zip(slots, backlog, strict=True)])
        for s, late in zip(slots, backlog, strict=True):
            s.feed = s.feed[-1:] if late else s.feed
    catch_up = (clock() - begin) / len(slots) if any(backlog) else 0.0  # shares of the drafting slots: they sum to it
    for step in range(slots[0].gamma):
        active = [not s.done and step < s.gamma for s in slots]
        if not any(active):  # every draft ended early (a low-confidence token)
            break
        rows = _pass(batch, [s.feed if a else None for s, a in zip(slots, active, strict=True)])
        for s, row in zip(slots, rows, strict=True):
            if row is not None:
                _sample(s, row, confidence)
    chains = chain_drafts([s.tokens for s in slots], [s.qs for s in slots])
    for b, (s, runner, draft) in enumerate(zip(slots, runners, chains, strict=True)):
        _unpack(batch, runner, b, batch.lengths[b])
        drafter = drafters[s.index]
        drafter._base, drafter._gamma = len(s.ctx.tokens), len(s.tokens)
        draft.catch_up_seconds = catch_up
        drafts[s.index] = draft
    return drafts


def _feed(ctx: DecodeContext, runner: Target) -> torch.Tensor:
    return torch.tensor(ctx.tokens[runner.cached_length :], dtype=torch.long).to(runner.device, non_blocking=True)


def _sample(s: _Slot, logits: torch.Tensor, confidence: float) -> None:
    """The slot's next token from its row, as the batch-1 drafter draws it; ends the slot's draft when done."""
    if s.ctx.sampling.greedy:
        token = greedy_tokens(logits).view(1)
        sure = confidence == 0.0 or torch.softmax(logits.float(), -1)[token].item() >= confidence
    else:
        q = warp(logits, s.ctx.sampling)
        token = draw(q, s.ctx.generator)
        s.qs.append(q)
        sure = confidence == 0.0 or q[token].item() >= confidence
    s.tokens.append(token)
    s.feed = token
    s.done = not sure or len(s.tokens) == s.gamma  # the last token is not fed: the verifier scores it


def _pass(batch: BatchTarget, feeds: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """One forward over slots 0 .. the last with a feed; a slot without one feeds a placeholder token that is not
    kept (its length is restored). Returns each fed slot's last row of logits (V,)."""
    hi = max(b for b, feed in enumerate(feeds) if feed is not None) + 1
    lengths = list(batch.lengths[:hi])
    placeholder = next(feed for feed in feeds if feed is not None)[:1]
    outs = batch.forward(0, [SlotFeed(feed if feed is not None else placeholder, Draft.empty())
                             for feed in feeds[:hi]])
    rows: list[torch.Tensor | None] = [None] * len(feeds)
    for b in range(hi):
        batch.commit(b, [])
        if feeds[b] is None:
            batch.cache.lengths[b] = lengths[b]
        else:
            rows[b] = outs[b].logits[0]
    return rows


def _pack(batch: BatchTarget, runners: list[Target]) -> None:
    """Copy each runner's committed entries into its slot of the batch cache (slot b = runners[b])."""
    cache = batch.cache
    for b, runner in enumerate(runners):
        cache.lengths[b] = runner.cached_length
    for i, layer in enumerate(cache.layers):
        source = next((r.cache.layers[i] for r in runners if r.cached_length), None)
        if source is None:
            return  # every slot starts empty: the first pass allocates the buffers
        keys, values = source.keys, source.values  # (1, heads, L, D)
        layer.key_buffer = keys.new_zeros(len(runners), keys.shape[1], cache.capacity, keys.shape[-1])
        layer.value_buffer = values.new_zeros(len(runners), values.shape[1], cache.capacity, values.shape[-1])
        for b, runner in enumerate(runners):
            length = runner.cached_length
            if length:
                own = runner.cache.layers[i]
                layer.key_buffer[b, :, :length] = own.keys[0, :, :length]
                layer.value_buffer[b, :, :length] = own.values[0, :, :length]


def _unpack(batch: BatchTarget, runner: Target, b: int, length: int) -> None:
    """Append slot b's new entries (past the runner's cached length, up to ``length``) to the runner's cache."""
    start = runner.cached_length
    if length > start:
        for layer, own in zip(batch.cache.layers, runner.cache.layers, strict=True):
            own.update(layer.key_buffer[b : b + 1, :, start:length], layer.value_buffer[b : b + 1, :, start:length])
    runner.cached_length = length
