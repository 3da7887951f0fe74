"""self_spec in batches: one skip-layer pass per draft step for every drafting slot, on the batch's own cache.

At batch 1 a slot's draft reads the target's cache through a batch-1 view, and every kept attention layer copies the
slot's committed entries to append its draft entries (a concatenation per layer per draft step). Here the draft pass
runs over all drafting slots at once directly on the batch's :class:`~specfamily.runtime.batch_cache.BatchCache`: each
slot's draft entries are written past its committed length (``drafters.shared.ragged``: ragged rows, per-slot masks),
where the target's next pass overwrites them, and the slots' lengths are set back afterwards; nothing is copied.
Each slot draws from its own row with its own generator and its own exit threshold, as its batch-1 ``propose``.
A slot whose first pass feeds more than its root (a newcomer's prompt) reports its rows' share of that pass as
``catch_up_seconds``, as the batch-1 ``propose`` reports its prompt's pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfamily.core.batch_slots import SlotTarget
from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock
from specfamily.core.types import Draft
from specfamily.drafters.shared.host_drafts import chain_drafts
from specfamily.drafters.shared.ragged import RowFeed, ragged_call

__all__ = ["propose_self_batch"]


@dataclass
class _Slot:
    """One drafting slot's proposal in progress."""

    index: int  # position in the caller's lists
    slot: int  # the batch cache's slot
    ctx: DecodeContext
    gamma: int
    committed: int  # the slot's committed length
    feed: torch.Tensor  # (k,) what the next pass feeds
    tokens: list[torch.Tensor] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)
    cut: bool = False
    done: bool = False
    catch_up_seconds: float = 0.0  # this slot's share of a first pass over more than its root


def propose_self_batch(drafters: list, ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft] | None:
    """Each slot's draft (empty for gamma 0), one pass per draft step for all; None when the contexts are not slots
    of one batch (the caller then proposes slot by slot). ``drafters``: SelfSpecDrafter copies with one skip set."""
    drafts = [Draft.empty() for _ in drafters]
    live = [i for i, g in enumerate(gammas) if g > 0]
    if not live:
        return drafts
    views = [ctxs[i].target for i in live]
    if not all(isinstance(v, SlotTarget) for v in views) or len({id(v.batch_cache) for v in views}) > 1:
        return None
    cache = views[0].batch_cache
    slots = [_Slot(i, v.slot, ctxs[i], gammas[i], v.cached_length,
                   torch.tensor(ctxs[i].tokens[v.cached_length :], dtype=torch.long).to(v.device, non_blocking=True))
             for i, v in zip(live, views, strict=True)]
    lo, hi = min(s.slot for s in slots), max(s.slot for s in slots) + 1
    lead = drafters[live[0]]
    committed = cache.lengths[lo:hi]
    try:
        for step in range(max(s.gamma for s in slots)):
            active = [s for s in slots if not s.done]
            if not active:
                break
            hidden = _catching_up(lead, cache, active, lo, hi) if step == 0 else _pass(lead, cache, active, lo, hi)
            logits = lead.runner.logits(hidden)  # (A, V)
            for s, row in zip(active, logits, strict=True):
                _draw(drafters[s.index], s, row, step)
    finally:
        cache.lengths[lo:hi] = committed  # the draft entries lie past the committed lengths: dropped
    for s, draft in zip(slots, chain_drafts([s.tokens for s in slots], [s.qs for s in slots]), strict=True):
        drafter = drafters[s.index]
        drafter._drafted, drafter._cut = len(s.tokens), s.cut
        drafts[s.index] = draft
        drafts[s.index].catch_up_seconds = s.catch_up_seconds
    return drafts


def _catching_up(lead, cache, active: list[_Slot], lo: int, hi: int) -> torch.Tensor:
    """``_pass``; when a slot feeds more than its root, the pass is timed and each such slot takes its rows' share
    of it as catch-up (context not seen yet: kept out of c)."""
    fed = [s.feed.numel() for s in active]
    if max(fed) == 1:
        return _pass(lead, cache, active, lo, hi)
    clock = device_clock(active[0].feed.device)
    start = clock()
    hidden = _pass(lead, cache, active, lo, hi)
    elapsed = clock() - start
    for s, rows in zip(active, fed, strict=True):
        s.catch_up_seconds = elapsed * rows / sum(fed) if rows > 1 else 0.0
    return hidden


def _pass(lead, cache, active: list[_Slot], lo: int, hi: int) -> torch.Tensor:
    """The skip-layer pass over every active slot's feed; (A, H) the final-normed state of each one's last row."""
    feeds: list[RowFeed | None] = [None] * (hi - lo)
    for s in active:
        length, k, device = cache.lengths[s.slot], s.feed.numel(), s.feed.device
        seen = length - s.committed  # this proposal's rows already in the slot
        visible = torch.ones(k, seen + k, dtype=torch.bool, device=device).tril(diagonal=seen)
        feeds[s.slot - lo] = RowFeed(s.feed, None, torch.arange(length, length + k, device=device), s.committed,
                                     visible)
    runner, plan = lead.runner, lead.plan

    def step(ids, _inputs, positions, mask, kv):
        return runner.hidden(ids, positions, mask, kv, plan)

    out = ragged_call(step, cache, feeds, runner.dtype, lo)  # (B, width, H)
    return torch.stack([out[s.slot - lo, s.feed.numel() - 1] for s in active])


def _draw(drafter, s: _Slot, logits: torch.Tensor, step: int) -> None:
    """The slot's next token as its batch-1 ``propose`` draws it; a low top-1 probability cuts the draft."""
    token, q, confidence = drafter._draw(logits, s.ctx)
    s.tokens.append(token)
    if q is not None:
        s.qs.append(q)
    s.feed = token
    if confidence is not None and step < s.gamma - 1 and float(confidence) < drafter.exit.threshold:
        s.cut = s.done = True
    s.done = s.done or len(s.tokens) == s.gamma
