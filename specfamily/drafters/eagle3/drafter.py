"""EAGLE-3 drafter: a dynamic token tree (EAGLE-2) or a chain from fused low/middle/high target features.

The drafter's KV cache holds one entry per committed pair (fused target feature at t, token t + 1): positions
``0 .. real - 1``. ``observe`` rolls back the entries of the last draft (their inputs were the layer's own
outputs) and queues the target's layer features; ``propose`` fuses and feeds the queued pairs in one call, whose
last output predicts the token after the root, then drafts from there, each step reading its parent's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from specfamily.core.costs import device_clock
from specfamily.core.draft_vocab import DraftVocab
from specfamily.core.drafter import BaseDrafter
from specfamily.core.dynamic_tree import grow_tree
from specfamily.core.sampling import warp
from specfamily.core.target import Target
from specfamily.core.tree_mask import additive, attention_mask, local_mask
from specfamily.core.types import DecodeContext, Draft, VerifyOutcome
from specfamily.drafters.eagle3.config import Eagle3Config
from specfamily.drafters.eagle3.model import Eagle3Model, Eagle3Shape, build_model, default_layers, draft_layer_config

DEFAULT_GAMMA = {"tree": 5, "chain": 4}
DEFAULT_TOP_K = 4
DEFAULT_TOTAL_TOKENS = 12  # nodes per tree on CPU, where a verify pass over n tokens grows quickly with n


@dataclass
class DraftState:
    """The drafter's per-request cache: committed pairs in ``cache``, observed features not yet fed."""

    cache: DynamicCache = field(default_factory=DynamicCache)
    real: int = 0  # pairs with target features in the cache: positions 0 .. real - 1
    pending: list[torch.Tensor] = field(default_factory=list)  # (m_i, k * H) blocks of target layer features
    pending_rows: int = 0


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every cache entry at or after ``length``."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


class Eagle3Drafter(BaseDrafter):
    """EAGLE-3 over the target's layer features; deterministic trees (q = None) or sampled chains with honest q
    (over the draft vocabulary, zero outside it)."""

    def __init__(
        self,
        target: Target,
        weights=None,
        gamma: int | None = None,
        policy: str | None = None,
        mode: str | None = None,
        top_k: int | None = None,
        total_tokens: int | None = None,
        layers: list[int] | tuple[int, ...] | None = None,
        draft_vocab: list[int] | None = None,
        seed: int = 0,
    ) -> None:
        config = Eagle3Config(weights, gamma, policy, mode, top_k, total_tokens, layers, draft_vocab, seed)
        self.model = load_model(target, config)
        self.needs_features: tuple[int, ...] = target.check_feature_layers(self.model.shape.layers)
        self.mode = config.mode or "tree"
        self.default_gamma = DEFAULT_GAMMA[self.mode]
        self.auto_max_gamma = None if self.mode == "tree" else BaseDrafter.auto_max_gamma
        super().__init__(gamma, policy)
        self.top_k = config.top_k or DEFAULT_TOP_K
        self.total_tokens = config.total_tokens or DEFAULT_TOTAL_TOKENS
        self.state = DraftState()

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.state = DraftState()

    def observe(self, outcome: VerifyOutcome) -> None:
        """Roll back the last draft's entries and queue the target's layer features of the committed positions."""
        state = self.state
        if outcome.features is None:
            raise RuntimeError("eagle3 needs the target's layer features: the loop passes them when needs_features "
                               "names layers")
        width = self.model.fc.in_features
        if outcome.features.shape[-1] != width:
            raise RuntimeError(f"eagle3 fuses {width}-wide features (layers {list(self.needs_features)}); "
                               f"got {outcome.features.shape[-1]}")
        expected = state.real + state.pending_rows
        if outcome.feature_start != expected:
            raise RuntimeError(f"features start at position {outcome.feature_start}, the drafter expected {expected}")
        crop(state.cache, state.real)
        state.pending.append(outcome.features)
        state.pending_rows += outcome.features.shape[0]

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        if self.state.pending_rows == 0:  # first pass: no features yet
            return Draft.empty()
        clock = device_clock(ctx.target.device)
        start = clock()
        root = self._catch_up(ctx)  # (H,) the layer's output at the root's pair
        catch_up = clock() - start
        draft = self._chain(ctx, root, gamma) if self.mode == "chain" else self._tree(ctx, root, gamma)
        draft.catch_up_seconds = catch_up
        return draft

    def _catch_up(self, ctx: DecodeContext) -> torch.Tensor:
        """Fuse and feed the queued (features, next token) pairs; return the last output (the root's)."""
        state = self.state
        crop(state.cache, state.real)
        features = torch.cat(state.pending) if len(state.pending) > 1 else state.pending[0]  # (m, k * H)
        start, m = state.real, state.pending_rows
        if len(ctx.tokens) < start + m + 1:
            raise RuntimeError(f"the context has {len(ctx.tokens)} tokens; features cover {start + m} positions")
        device = features.device
        tokens = torch.tensor(ctx.tokens[start + 1 : start + m + 1], dtype=torch.long, device=device)
        positions = torch.arange(start, start + m, device=device)
        mask = None if m == 1 else attention_mask(start, local_mask(m, [], features.dtype).to(device))
        fused = self.model.fuse(features)  # (m, H)
        hidden = self.model(tokens[None], fused[None], positions[None], mask, state.cache)[0]  # (m, H)
        state.real, state.pending, state.pending_rows = start + m, [], 0
        return hidden[-1]

    def _chain(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """gamma tokens: argmax at temperature 0, else sampled from the warped q (reported over V, as drawn)."""
        model, sampling = self.model, ctx.sampling
        hidden, tokens, qs = root, [], []
        for i in range(gamma):
            logits = model.logits(hidden)  # (N,) over the draft vocabulary
            if sampling.greedy:
                token = model.token_ids(logits.argmax().view(1))
            else:
                q = warp(logits, sampling)
                token = model.token_ids(torch.multinomial(q, 1, generator=ctx.generator))
                qs.append(model.full_q(q))
            tokens.append(token)
            if i + 1 < gamma:
                position = torch.full((1, 1), self.state.real + i, dtype=torch.long, device=root.device)
                hidden = model(token[None], hidden[None, None], position, None, self.state.cache)[0, 0]
        return Draft.chain(torch.cat(tokens).cpu(), torch.stack(qs).cpu() if qs else None)

    def _tree(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """EAGLE-2 dynamic tree over draft-vocabulary indices, scored at the sampling temperature."""
        temperature = ctx.sampling.temperature or 1.0
        feeder = TreeFeeder(self.model, self.state, root, temperature, self.top_k, gamma)
        root_logp = torch.log_softmax(self.model.logits(root).float() / temperature, dim=-1)
        tree = grow_tree(root_logp, feeder.step, gamma, self.top_k, self.total_tokens)
        return Draft(self.model.token_ids(tree.tokens).cpu(), tree.parents.cpu(), None)


class TreeFeeder:
    """Feeds chosen tree nodes, one batched call per depth, under an ancestor mask over the drafter's cache."""

    def __init__(self, model: Eagle3Model, state: DraftState, root: torch.Tensor, temperature: float, top_k: int,
                 gamma: int) -> None:
        self.model, self.state, self.root, self.temperature = model, state, root, temperature
        device, deeper = root.device, max(gamma - 1, 0)
        self.slot_of = torch.full((top_k + deeper * top_k * top_k,), -1, dtype=torch.long, device=device)
        self.hidden = root.new_empty(top_k * deeper, root.shape[-1])  # (F, H) outputs of fed nodes
        self.ancestors = torch.zeros(top_k * deeper, top_k * deeper, dtype=torch.bool, device=device)
        self.fed = 0
        self.depth = 0

    def step(self, nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Feed nodes (k,) of one depth; return their children's log-probabilities (k, N)."""
        k, fed, real, device = nodes.numel(), self.fed, self.state.real, nodes.device
        self.depth += 1
        has_parent = parents >= 0
        parent_slots = torch.where(has_parent, self.slot_of[parents.clamp(min=0)], 0)  # (k,)
        hidden = torch.where(has_parent[:, None], self.hidden[parent_slots], self.root)  # (k, H)
        new = torch.arange(fed, fed + k, device=device)
        rows = self.ancestors[parent_slots] & has_parent[:, None]  # (k, F)
        rows[torch.arange(k, device=device), new] = True
        self.ancestors[new] = rows
        mask = torch.zeros(1, 1, k, real + fed + k, dtype=hidden.dtype, device=device)
        mask[0, 0, :, real:] = additive(rows[:, : fed + k], hidden.dtype)
        positions = torch.full((1, k), real + self.depth - 1, dtype=torch.long, device=device)
        out = self.model(self.model.token_ids(tokens)[None], hidden[None], positions, mask, self.state.cache)[0]
        self.hidden[new] = out
        self.slot_of[nodes] = new
        self.fed = fed + k
        return torch.log_softmax(self.model.logits(out).float() / self.temperature, dim=-1)


def load_model(target: Target, config: Eagle3Config) -> Eagle3Model:
    """A built model as is, fresh modules for weights="random", else the checkpoint folder in any layout."""
    weights = config.weights
    if isinstance(weights, Eagle3Model):
        if weights.target_embed[0] is not target.model.get_input_embeddings():
            raise ValueError("this Eagle3Model was built for another target (it reads another model's embedding)")
        return _checked_layers(weights, config.layers)
    if weights == "random":
        layers = config.layers or default_layers(target.num_layers)
        target.check_feature_layers(layers)
        vocab = _random_vocab(config.draft_vocab, target.vocab_size)
        shape = Eagle3Shape(draft_layer_config(target.model), layers)
        return build_model(target.model, shape, vocab, seed=config.seed)
    if weights is None:
        raise ValueError("eagle3 needs weights=: a checkpoint folder (ours, EAGLE/SpecForge or speculators layout) "
                         "or 'random'; no shipped eagle3 weights exist for this target yet")
    from specfamily.drafters.eagle3.formats import load_eagle3

    return _checked_layers(load_eagle3(weights, target), config.layers)


def _checked_layers(model: Eagle3Model, layers: tuple[int, ...] | None) -> Eagle3Model:
    if layers is not None and tuple(layers) != model.shape.layers:
        raise ValueError(f"eagle3 layers {list(layers)} differ from the {list(model.shape.layers)} these weights "
                         "were trained on")
    return model


def _random_vocab(ids: list[int] | None, vocab_size: int) -> DraftVocab | None:
    return None if ids is None else DraftVocab(torch.tensor(sorted(set(ids)), dtype=torch.long), vocab_size)

