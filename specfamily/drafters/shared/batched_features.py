"""Feature drafting (the EAGLE family) in batches: one draft-layer call per draft step for every drafting slot.

Each slot's drafter keeps its batch-1 state (:class:`~specfamily.drafters.shared.feature_drafting.FeatureState`), so
``observe`` is unchanged; its committed pairs live in a row of the prototype's batch draft cache
(:class:`~specfamily.drafters.shared.draft_rows.DraftRows`, one ragged one-layer
:class:`~specfamily.runtime.batch_cache.BatchCache` kept across proposals: a request's pairs are copied there once, when
it first drafts in a batch). A batched proposal runs, for all slots at once over the span of their rows (rows of
requests not drafting this pass are padding): the catch-up over each slot's queued features (ragged, causal within a
slot), written to its row, then per depth one layer call over every slot's fed rows (a chain's token, or the tree nodes
its EAGLE-2 growth chose, ragged) and one head call over all of their outputs. Trees grow in lockstep through
:func:`~specfamily.drafters.shared.dynamic_tree.grow_tree_steps`, each with its slot's own expansion rule and generator,
so each slot's draft is the one its batch-1 ``propose`` gives, up to the float rounding of a call of another shape. The
catch-up entries stay in each slot's row; the draft's own entries are dropped by setting the row's length back
(``observe`` drops them at batch 1 too).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock
from specfamily.core.host import draw
from specfamily.core.sampling import greedy_tokens, warp
from specfamily.core.types import Draft
from specfamily.drafters.shared.draft_rows import DraftRows
from specfamily.drafters.shared.dynamic_tree import DraftTree, expand_sampled, grow_tree_steps
from specfamily.drafters.shared.feature_drafting import FeatureDrafter, TopkRows, TreeFeeder, drawn_q
from specfamily.drafters.shared.host_drafts import chain_drafts
from specfamily.drafters.shared.lockstep_tree import grow_lockstep, kept_drafts
from specfamily.drafters.shared.ragged import RowFeed, ragged_call
from specfamily.runtime.batch_cache import BatchCache

__all__ = ["propose_feature_batch"]


def propose_feature_batch(drafters: list[FeatureDrafter], ctxs: list[DecodeContext], gammas: list[int],
                          rows: DraftRows) -> list[Draft]:
    """Each slot's draft (empty for gamma 0 or before its first features): the drafters' own chains or trees, one
    layer call per step for all slots. ``drafters`` share one model (slot copies of one drafter); ``rows``: the
    batch draft cache their committed pairs are kept in across proposals."""
    drafts = [Draft.empty() for _ in drafters]
    live = [i for i, g in enumerate(gammas) if g > 0 and drafters[i].state.pending_rows > 0]
    if not live:
        return drafts
    lead = drafters[live[0]]
    clock = device_clock(ctxs[live[0]].target.device)
    start = clock()
    states = [drafters[i].state for i in live]
    held = rows.rows_for(states)  # may grow the pool: its cache is read after
    cache = _Span(rows.cache, held)
    try:
        roots = _catch_up(lead, cache, [drafters[i] for i in live], [ctxs[i] for i in live])  # (B, H)
        catch_up_seconds = (clock() - start) / len(live)  # each drafting slot its share: they sum to the call
        slots = [(i, drafters[i], ctxs[i], gammas[i]) for i in live]
        if lead.mode == "chain":
            made = _chains(lead, cache, slots, roots)
        else:
            made = _trees(lead, cache, slots, roots)
    finally:
        rows.drop_drafts(states)
    for i, draft in zip(live, made, strict=True):
        draft.catch_up_seconds = catch_up_seconds
        drafts[i] = draft
    return drafts


@dataclass
class _Span:
    """The drafting slots' rows of the batch draft cache: slot b is row ``rows[b]``; a call spans rows ``lo .. hi``."""

    cache: BatchCache
    rows: list[int]

    def __post_init__(self) -> None:
        self.lo, self.hi = min(self.rows), max(self.rows) + 1
        self.index = torch.tensor([row - self.lo for row in self.rows])
        self.ordered = self.rows == list(range(self.lo, self.hi))  # the call's outputs are already slot b's at b


def _call(lead: FeatureDrafter, span: _Span, feeds: list[RowFeed | None]) -> torch.Tensor:
    """One call of the drafter's layer over the fed slots (the mask in its inputs' dtype): outputs (B, width, H),
    slot b's at row b (an unfed slot's row is meaningless). Rows of the span that no slot feeds are padding."""
    dtype = next(feed for feed in feeds if feed is not None).inputs.dtype
    spread: list[RowFeed | None] = [None] * (span.hi - span.lo)
    for row, feed in zip(span.rows, feeds, strict=True):
        spread[row - span.lo] = feed
    out = ragged_call(lead._step, span.cache, spread, dtype, span.lo)
    if span.ordered:
        return out
    index = span.index.clamp(max=out.shape[0] - 1)  # the call ends at the last fed row: unfed slots read nothing
    return out.index_select(0, index.to(out.device, non_blocking=True))


def _catch_up(lead: FeatureDrafter, cache: _Span, drafters: list[FeatureDrafter],
              ctxs: list[DecodeContext]) -> torch.Tensor:
    """Feed every slot's queued (feature, next token) pairs in one call (causal within a slot), kept in each slot's
    row; return each slot's root output (B, H)."""
    blocks = [torch.cat(d.state.pending) if len(d.state.pending) > 1 else d.state.pending[0] for d in drafters]
    fused = lead._fuse(torch.cat(blocks)).split([b.shape[0] for b in blocks])  # (m_b, H) each
    feeds = []
    for drafter, ctx, inputs in zip(drafters, ctxs, fused, strict=True):
        start, m = drafter.state.real, drafter.state.pending_rows
        if len(ctx.tokens) < start + m + 1:
            raise RuntimeError(f"the context has {len(ctx.tokens)} tokens; features cover {start + m} positions")
        device = inputs.device
        ids = torch.tensor(ctx.tokens[start + 1 : start + m + 1], dtype=torch.long).to(device, non_blocking=True)
        causal = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        feeds.append(RowFeed(ids, inputs, torch.arange(start, start + m, device=device), start, causal))
    out = _call(lead, cache, feeds)
    for drafter, row in zip(drafters, cache.rows, strict=True):
        state = drafter.state
        state.real, state.pending, state.pending_rows = cache.cache.lengths[row], [], 0
    return torch.stack([out[b, feed.ids.numel() - 1] for b, feed in enumerate(feeds)])


def _chains(lead: FeatureDrafter, cache: _Span, slots: list, roots: torch.Tensor) -> list[Draft]:
    """Each slot's chain of its gamma tokens, as FeatureDrafter._chain draws it; one layer call per depth."""
    model = lead.model
    hidden = list(roots)
    tokens: list[list[torch.Tensor]] = [[] for _ in slots]
    qs: list[list[torch.Tensor]] = [[] for _ in slots]
    for i in range(max(gamma for *_, gamma in slots)):
        active = [b for b, (*_, gamma) in enumerate(slots) if i < gamma]
        logits = lead._draft_logits(torch.stack([hidden[b] for b in active]))  # (A, N)
        feeds: list[RowFeed | None] = [None] * len(slots)
        for b, row in zip(active, logits, strict=True):
            _, drafter, ctx, gamma = slots[b]
            if ctx.sampling.greedy:
                token = model.token_ids(greedy_tokens(row).view(1))
            else:
                q = warp(row, ctx.sampling)
                token = model.token_ids(draw(q, ctx.generator))
                qs[b].append(lead._full_q(q))
            tokens[b].append(token)
            if i + 1 < gamma:
                real = drafter.state.real
                position = torch.full((1,), real + i, dtype=torch.long, device=token.device)
                visible = torch.ones(1, i + 1, dtype=torch.bool, device=token.device)
                feeds[b] = RowFeed(token, hidden[b][None], position, real, visible)
        if any(feed is not None for feed in feeds):
            out = _call(lead, cache, feeds)
            for b, feed in enumerate(feeds):
                if feed is not None:
                    hidden[b] = out[b, 0]
    return chain_drafts(tokens, qs)


def _trees(lead: FeatureDrafter, cache: _Span, slots: list, roots: torch.Tensor) -> list[Draft]:
    """Each slot's EAGLE-2 tree (top-k, or sampled as its drafter's ``tree_sampling`` says), grown in lockstep: in
    fixed shapes with one host copy when every slot's tree is top-k (``lockstep_tree``), else slot by slot."""
    root_logits = lead._draft_logits(roots)  # (B, N)
    top_k = slots[0][1].top_k
    if (not any(drafter.draws_children(ctx) for _, drafter, ctx, _ in slots)
            and all(drafter.top_k == top_k for _, drafter, _, _ in slots) and top_k <= root_logits.shape[-1]):
        return _topk_trees(lead, cache, slots, roots, root_logits)
    growing, feeders, sampled, trees = {}, [], [], [None] * len(slots)
    for b, (_, drafter, ctx, gamma) in enumerate(slots):
        draws = drafter.draws_children(ctx)
        rows = partial(warp, sampling=ctx.sampling) if draws else TopkRows(ctx.sampling.temperature or 1.0)
        expand = partial(expand_sampled, top_k=drafter.top_k, generator=ctx.generator) if draws else None
        feeders.append(TreeFeeder(lead.model, lead._step, drafter.state, roots[b], drafter.top_k, gamma,
                                  lead._draft_logits, rows))
        sampled.append(draws)
        growing[b] = grow_tree_steps(rows(root_logits[b]), gamma, drafter.top_k, drafter.total_tokens, expand)
    requests = {b: _advance(steps, None, trees, b) for b, steps in growing.items()}
    while any(r is not None for r in requests.values()):
        fed = {b: request for b, request in requests.items() if request is not None}
        for b, rows in _feed_depth(lead, cache, feeders, fed).items():
            requests[b] = _advance(growing[b], rows, trees, b)
    return [_tree_draft(lead, tree, draws) for tree, draws in zip(trees, sampled, strict=True)]


def _feed_depth(lead: FeatureDrafter, cache: _Span, feeders: list[TreeFeeder],
                fed: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
    """One depth of every growing tree in one layer call: slot b feeds ``fed[b]`` (nodes, tokens, parents) through
    its feeder; each fed slot's children's rows (k_b, N), as its feeder's ``rows`` makes them."""
    feeds: list[RowFeed | None] = [None] * len(feeders)
    for b, request in fed.items():
        ids, inputs, position, visible = feeders[b].prepare(*request)
        positions = torch.full((ids.numel(),), position, dtype=torch.long, device=ids.device)
        feeds[b] = RowFeed(ids, inputs, positions, feeders[b].state.real, visible)
    out = _call(lead, cache, feeds)
    outputs = {b: out[b, : feeds[b].ids.numel()] for b in fed}
    logits = lead._draft_logits(torch.cat(list(outputs.values()))).split([o.shape[0] for o in outputs.values()])
    rows = {}
    for (b, output), row in zip(outputs.items(), logits, strict=True):
        feeders[b].record(output)
        rows[b] = feeders[b].rows(row)
    return rows


def _topk_trees(lead: FeatureDrafter, cache: _Span, slots: list, roots: torch.Tensor,
                root_logits: torch.Tensor) -> list[Draft]:
    """Every slot's top-k tree grown in fixed shapes (``top_k`` nodes fed a depth, one layer call a depth for the
    slots still growing), read to the host in one copy: the trees ``grow_tree`` gives each slot alone."""
    top_k = slots[0][1].top_k
    rows = [TopkRows(ctx.sampling.temperature or 1.0) for _, _, ctx, _ in slots]
    feeders = [TreeFeeder(lead.model, lead._step, drafter.state, roots[b], top_k, gamma, lead._draft_logits, rows[b])
               for b, (_, drafter, _, gamma) in enumerate(slots)]

    def step(active: list[int], nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        fed = _feed_depth(lead, cache, feeders, {b: (nodes[b], tokens[b], parents[b]) for b in active})
        return torch.stack([fed[b] for b in active])

    root_rows = torch.stack([rows[b](row) for b, row in enumerate(root_logits)])
    kept = grow_lockstep(root_rows, [gamma for *_, gamma in slots], top_k,
                         [drafter.total_tokens for _, drafter, _, _ in slots], step)
    return kept_drafts(kept, lead.model.token_ids)


def _advance(steps, rows: torch.Tensor | None, trees: list, b: int):
    """The next step a tree asks for (None when it is grown, its tree then in ``trees[b]``)."""
    try:
        return next(steps) if rows is None else steps.send(rows)
    except StopIteration as grown:
        trees[b] = grown.value
        return None


def _tree_draft(lead: FeatureDrafter, tree: DraftTree, sampled: bool) -> Draft:
    tokens, parents = lead.model.token_ids(tree.tokens).cpu(), tree.parents.cpu()
    if not sampled:
        return Draft(tokens, parents, None)
    return Draft(tokens, parents, lead._full_q(drawn_q(tree).float()).cpu())
