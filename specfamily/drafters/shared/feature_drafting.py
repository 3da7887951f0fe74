"""Drafting over the target's features (the EAGLE family): the queued-feature state, catch-up, chains and trees.

The drafter's KV cache holds one entry per committed pair (target feature at t, token t + 1): positions
``0 .. real - 1``. ``observe`` rolls back the entries of the last draft and queues the target's features;
``propose`` feeds the queued pairs in one call, whose last output is the root's, then drafts a chain or an
EAGLE-2 dynamic tree from there. Under sampling a tree is top-k (deterministic, q = None) or sampled (children
drawn without replacement from the warped q, each reported with its conditional q), per ``tree_sampling``.
A drafter package supplies the model-specific parts: how features become the layer's input (``_fuse``), one
call of its layer (``_step``), its drafting logits and its q over the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch
from transformers import DynamicCache

from specfamily.core.context import DecodeContext
from specfamily.core.costs import device_clock
from specfamily.core.drafter import BaseDrafter
from specfamily.core.host import draw, to_host
from specfamily.core.sampling import greedy_tokens, warp
from specfamily.core.tree_mask import additive, attention_mask, local_mask
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.shared.draft_rows import DraftRows
from specfamily.drafters.shared.dynamic_tree import DraftTree, expand_sampled, grow_tree, is_draw_prefix, sibling_q
from specfamily.drafters.shared.lockstep_tree import grow_lockstep, kept_drafts

TREE_SAMPLING = ("topk", "sampled")  # how a tree's children are chosen at temperature > 0

# One call of the drafter's layer: (tokens (1, q), inputs (1, q, H), positions (1, q), additive mask or None,
# cache) -> outputs (1, q, H).
Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, DynamicCache], torch.Tensor]


class FeatureModel(Protocol):
    """What the shared drafting reads from a drafter's model."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...  # (..., N) over the draft vocabulary

    def token_ids(self, index: torch.Tensor) -> torch.Tensor: ...  # target ids of draft-vocabulary indices


@dataclass
class FeatureState:
    """The drafter's per-request cache: committed pairs in ``cache`` (or in row ``row`` of the batch draft cache
    ``held`` while batched proposals hold them: ``draft_rows``), observed features not yet fed."""

    cache: DynamicCache = field(default_factory=DynamicCache)
    real: int = 0  # pairs (f[t], x[t + 1]) with target features in the cache: positions 0 .. real - 1
    pending: list[torch.Tensor] = field(default_factory=list)  # (m_i, W) blocks of target features
    pending_rows: int = 0
    held: DraftRows | None = None  # the batch draft cache whose row holds the committed pairs (cache is empty)
    row: int = -1


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every cache entry at or after ``length``."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.shape[2] > length:  # nothing past it: nothing to drop
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def queue_features(state: FeatureState, outcome: VerifyOutcome) -> None:
    """Roll back the last draft's entries and queue the outcome's features (they must follow the queued ones)."""
    expected = state.real + state.pending_rows
    if outcome.feature_start != expected:
        raise RuntimeError(f"features start at position {outcome.feature_start}, the drafter expected {expected}")
    crop(state.cache, state.real)
    state.pending.append(outcome.features)
    state.pending_rows += outcome.features.shape[0]


def catch_up(state: FeatureState, context: list[int], fuse: Callable, step: Step) -> torch.Tensor:
    """Feed the queued (feature, next token) pairs in one call; return the last output (H,), the root's."""
    crop(state.cache, state.real)
    features = torch.cat(state.pending) if len(state.pending) > 1 else state.pending[0]  # (m, W)
    start, m = state.real, state.pending_rows
    if len(context) < start + m + 1:
        raise RuntimeError(f"the context has {len(context)} tokens; features cover {start + m} positions")
    device = features.device
    tokens = torch.tensor(context[start + 1 : start + m + 1], dtype=torch.long, device=device)
    positions = torch.arange(start, start + m, device=device)
    mask = None if m == 1 else attention_mask(start, local_mask(m, [], features.dtype).to(device))
    hidden = step(tokens[None], fuse(features)[None], positions[None], mask, state.cache)[0]  # (m, H)
    state.real, state.pending, state.pending_rows = start + m, [], 0
    return hidden[-1]


class FeatureDrafter(BaseDrafter):
    """Chain (sampled with honest q) or dynamic-tree drafting over queued target features.

    Subclasses set ``model``, ``mode``, ``top_k``, ``total_tokens``, ``tree_sampling`` (one of ``TREE_SAMPLING``;
    greedy decoding always drafts top-k trees) and define ``_step`` and ``_full_q``; they
    may override ``_fuse`` (default: features as they are) and ``_draft_logits`` (default: ``model.logits``).
    """

    model: FeatureModel
    mode: str
    top_k: int
    total_tokens: int
    tree_sampling: str
    batch_shared = ("batch_rows",)  # every slot copy's state is a row of the prototype's batch draft cache

    def __init__(self, gamma: int | None = None, policy: str | None = None) -> None:
        super().__init__(gamma, policy)
        self.state = FeatureState()
        self.batch_rows = DraftRows()

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self._release()
        self.state = FeatureState()

    def end(self) -> None:
        super().end()
        self._release()

    def _release(self) -> None:
        """Free the batch draft cache's row of this request's state (its request is over)."""
        if self.state.held is not None:
            self.state.held.release(self.state)

    def observe(self, outcome: VerifyOutcome) -> None:
        """Roll back the last draft's entries and queue the target's features of the committed positions."""
        queue_features(self.state, outcome)

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        if self.state.pending_rows == 0:  # first pass: no features yet
            return Draft.empty()
        clock = device_clock(ctx.target.device)
        start = clock()
        root = self._catch_up(ctx)  # (H,) the output at the root's pair
        catch_up_seconds = clock() - start
        draft = self._chain(ctx, root, gamma) if self.mode == "chain" else self._tree(ctx, root, gamma)
        draft.catch_up_seconds = catch_up_seconds
        return draft

    def _step(self, tokens: torch.Tensor, inputs: torch.Tensor, positions: torch.Tensor,
              mask: torch.Tensor | None, cache: DynamicCache) -> torch.Tensor:
        raise NotImplementedError

    def _full_q(self, q: torch.Tensor) -> torch.Tensor:
        """(V,) a draft-vocabulary distribution (N,) over the whole vocabulary."""
        raise NotImplementedError

    def _fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(m, H) the layer's inputs from the target's (m, W) features."""
        return features

    def _draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)

    def _catch_up(self, ctx: DecodeContext) -> torch.Tensor:
        if self.state.held is not None:  # batched proposals held its pairs: back into its own cache
            self.state.held.check_in(self.state)
        return catch_up(self.state, ctx.tokens, self._fuse, self._step)

    def _chain(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """gamma tokens: argmax at temperature 0, else sampled from the warped q (reported over V, as drawn)."""
        model, sampling = self.model, ctx.sampling
        hidden, tokens, qs = root, [], []
        for i in range(gamma):
            logits = self._draft_logits(hidden)  # (V,), or (N,) over a reduced draft vocabulary
            if sampling.greedy:
                token = model.token_ids(greedy_tokens(logits).view(1))
            else:
                q = warp(logits, sampling)
                token = model.token_ids(draw(q, ctx.generator))
                qs.append(self._full_q(q))  # zero outside the draft vocabulary
            tokens.append(token)
            if i + 1 < gamma:
                position = torch.full((1, 1), self.state.real + i, dtype=torch.long, device=root.device)
                hidden = self._step(token[None], hidden[None, None], position, None, self.state.cache)[0, 0]
        return Draft.chain(*to_host([torch.cat(tokens), torch.stack(qs) if qs else None]))  # one wait for both

    def draws_children(self, ctx: DecodeContext) -> bool:
        """Whether its tree for ``ctx`` draws each node's children from q (a sampled tree) rather than taking the
        top-k."""
        return self.tree_sampling == "sampled" and not ctx.sampling.greedy

    def _tree(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """EAGLE-2 dynamic tree over draft-vocabulary indices: top-k children scored at the sampling temperature
        (q = None), or, sampling with ``tree_sampling == "sampled"``, children drawn from the warped q."""
        if self.draws_children(ctx):
            return self._sampled_tree(ctx, root, gamma)
        temperature = ctx.sampling.temperature or 1.0
        rows = TopkRows(temperature)
        feeder = TreeFeeder(self.model, self._step, self.state, root, self.top_k, gamma, self._draft_logits, rows)
        root_row = rows(self._draft_logits(root))
        if root.device.type != "cpu" and self.top_k <= root_row.shape[-1]:  # one host copy, not one a depth
            kept = grow_lockstep(root_row[None], [gamma], self.top_k, [self.total_tokens], partial(_one_slot, feeder))
            return kept_drafts(kept, self.model.token_ids)[0]
        tree = grow_tree(root_row, feeder.step, gamma, self.top_k, self.total_tokens)
        return Draft(self.model.token_ids(tree.tokens).cpu(), tree.parents.cpu(), None)

    def _sampled_tree(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """Children drawn without replacement from warp(logits) with ``ctx.generator``; kept siblings are a prefix
        of their draw order, each reported with its q given the earlier ones (over V, zero outside the draft
        vocabulary)."""
        rows = partial(warp, sampling=ctx.sampling)  # the warped q rows the children are drawn from
        feeder = TreeFeeder(self.model, self._step, self.state, root, self.top_k, gamma, self._draft_logits, rows)
        expand = partial(expand_sampled, top_k=self.top_k, generator=ctx.generator)
        tree = grow_tree(rows(self._draft_logits(root)), feeder.step, gamma, self.top_k, self.total_tokens, expand)
        q = self._full_q(drawn_q(tree).float())
        return Draft(self.model.token_ids(tree.tokens).cpu(), tree.parents.cpu(), q.cpu())


def _one_slot(feeder: TreeFeeder, active: list[int], nodes: torch.Tensor, tokens: torch.Tensor,
              parents: torch.Tensor) -> torch.Tensor:
    """:func:`grow_lockstep`'s step for a batch of one: the feeder's step on the slot's nodes, as (1, k, N)."""
    return feeder.step(nodes[0], tokens[0], parents[0])[None]


def drawn_q(tree: DraftTree) -> torch.Tensor:
    """(t, N) each kept node's conditional q given its earlier siblings; refuses a tree whose kept siblings are not
    a prefix of their draw order (dropping an earlier sibling while keeping a later one changes the later's law)."""
    if not is_draw_prefix(tree):
        raise RuntimeError("a sampled tree kept a later-drawn sibling without an earlier one: its conditional q "
                           "would be misreported")
    return sibling_q(tree.tokens, tree.parents, torch.cat(tree.expanded)[tree.rows])


@dataclass
class TopkRows:
    """The top-k tree's rows: log-probabilities at the sampling temperature (1 when greedy)."""

    temperature: float

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float() / self.temperature, dim=-1)


class TreeFeeder:
    """Feeds chosen tree nodes, one batched call per depth, under an ancestor mask over the drafter's cache."""

    def __init__(self, model: FeatureModel, forward: Step, state: FeatureState, root: torch.Tensor,
                 top_k: int, gamma: int, logits: Callable, rows: Callable) -> None:
        self.model, self.forward, self.state, self.root = model, forward, state, root
        self.logits = logits  # the drafter's head: its kind of product over a depth's rows
        self.rows = rows  # logits (k, N) -> what the tree expands: log-probabilities or warped q
        device, deeper = root.device, max(gamma - 1, 0)
        self.slot_of = torch.full((top_k + deeper * top_k * top_k,), -1, dtype=torch.long, device=device)
        self.hidden = root.new_empty(top_k * deeper, root.shape[-1])  # (F, H) outputs of fed nodes
        self.ancestors = torch.zeros(top_k * deeper, top_k * deeper, dtype=torch.bool, device=device)  # fed slots
        self.fed = 0
        self.depth = 0
        self._fed_nodes = torch.zeros(0, dtype=torch.long, device=device)  # the nodes prepare() fed last

    def step(self, nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Feed nodes (k,) of one depth; return their children's rows (k, N)."""
        ids, inputs, position, visible = self.prepare(nodes, tokens, parents)
        k, real = nodes.numel(), self.state.real
        mask = torch.zeros(1, 1, k, real + visible.shape[1], dtype=inputs.dtype, device=inputs.device)
        mask[0, 0, :, real:] = additive(visible, inputs.dtype)
        positions = torch.full((1, k), position, dtype=torch.long, device=inputs.device)
        out = self.forward(ids[None], inputs[None], positions, mask, self.state.cache)[0]  # (k, H)
        self.record(out)
        return self.rows(self.logits(out))

    def prepare(self, nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """What feeding nodes (k,) of one depth reads: their ids (k,) (draft-vocabulary indices as the target's),
        inputs (k, H), position, and which fed slots each sees (k, fed + k) past the committed pairs."""
        k, fed, device = nodes.numel(), self.fed, nodes.device
        self.depth += 1
        has_parent = parents >= 0
        parent_slots = torch.where(has_parent, self.slot_of[parents.clamp(min=0)], 0)  # (k,)
        inputs = torch.where(has_parent[:, None], self.hidden[parent_slots], self.root)  # (k, H)
        new = torch.arange(fed, fed + k, device=device)
        rows = self.ancestors[parent_slots] & has_parent[:, None]  # (k, F)
        rows[torch.arange(k, device=device), new] = True
        self.ancestors[new] = rows
        self._fed_nodes = nodes
        return self.model.token_ids(tokens), inputs, self.state.real + self.depth - 1, rows[:, : fed + k]

    def record(self, out: torch.Tensor) -> None:
        """Keep the outputs (k, H) of the nodes :meth:`prepare` fed."""
        nodes, fed = self._fed_nodes, self.fed
        new = torch.arange(fed, fed + nodes.numel(), device=nodes.device)
        self.hidden[new] = out
        self.slot_of[nodes] = new
        self.fed = fed + nodes.numel()
