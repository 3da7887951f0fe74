"""EAGLE drafter: a dynamic token tree (EAGLE-2) or a chain (EAGLE-1 style) from one decoder layer over features.

The drafter's KV cache holds one entry per committed pair (target feature at t, token t + 1): positions
``0 .. real - 1``. ``observe`` rolls back the entries of the last draft (their features were predictions) and
queues the target's real features; ``propose`` feeds the queued pairs in one call, whose last output predicts the
root's feature, then drafts from there with one batched call per depth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from specfamily import zoo
from specfamily.core.costs import device_clock
from specfamily.core.draft_vocab import DraftVocab
from specfamily.core.drafter import BaseDrafter
from specfamily.core.dynamic_tree import grow_tree
from specfamily.core.matmul import linear_for
from specfamily.core.sampling import warp
from specfamily.core.target import Target
from specfamily.core.tree_mask import additive, attention_mask, local_mask
from specfamily.core.types import DecodeContext, Draft, VerifyOutcome
from specfamily.drafters.eagle.checkpoint import load_eagle
from specfamily.drafters.eagle.config import EagleConfig
from specfamily.drafters.eagle.lean import LeanEagleLayer, lean_eagle_unsupported
from specfamily.drafters.eagle.model import EagleModel, build_model

DEFAULT_GAMMA = {"tree": 5, "chain": 4}
DEFAULT_TOP_K = 4
# Nodes kept per tree when the checkpoint carries no calibration (``python -m specfamily.drafters.eagle.calibrate``
# measures the fastest shape on the machine and stores it). On CPU a verify pass over n tokens grows quickly with
# n, so the best tree is far below EAGLE-2's GPU default of 60.
DEFAULT_TOTAL_TOKENS = 12


@dataclass
class DraftState:
    """The drafter's per-request cache: committed pairs in ``cache``, observed features not yet fed."""

    cache: DynamicCache = field(default_factory=DynamicCache)
    real: int = 0  # pairs (f[t], x[t + 1]) with target features in the cache: positions 0 .. real - 1
    pending: list[torch.Tensor] = field(default_factory=list)  # (m_i, H) blocks of target features
    pending_rows: int = 0


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every cache entry at or after ``length``."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length() if cache.layers else 0


class EagleDrafter(BaseDrafter):
    """EAGLE-1/2 over the target's features; deterministic trees (q = None) or sampled chains with honest q."""

    needs_features = True

    def __init__(
        self,
        target: Target,
        weights: str | Path | EagleModel | None = None,
        gamma: int | None = None,
        policy: str | None = None,
        mode: str | None = None,
        top_k: int | None = None,
        total_tokens: int | None = None,
        seed: int = 0,
        draft_vocab: int | str | list[int] | None = None,
    ) -> None:
        config = EagleConfig(weights, gamma, policy, mode, top_k, total_tokens, seed, draft_vocab)
        self.model, calibration = _load(target, config)
        self.linear = linear_for(target.matmul)  # the layer and the head's single rows, multiplied as the target does
        self.forward = fast_forward(self.model, self.linear)
        mode = mode or calibration.get("mode", "tree")  # the calibrated shape's mode is the default
        calibrated = calibration.get("mode", "tree") == mode  # ... and its gamma that mode's default
        self.default_gamma = calibration.get("gamma", DEFAULT_GAMMA[mode]) if calibrated else DEFAULT_GAMMA[mode]
        self.auto_max_gamma = None if mode == "tree" else BaseDrafter.auto_max_gamma  # trees: calibrated depth
        super().__init__(gamma, policy)
        self.mode = mode
        self.top_k = DEFAULT_TOP_K if top_k is None else top_k
        calibrated_tree = calibrated and mode == "tree"
        self.total_tokens = total_tokens or (calibration.get("total_tokens") if calibrated_tree else None) \
            or DEFAULT_TOTAL_TOKENS
        self.state = DraftState()

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.state = DraftState()

    def observe(self, outcome: VerifyOutcome) -> None:
        """Roll back the last draft's entries and queue the target's features of the committed positions."""
        state = self.state
        if outcome.features is None:
            raise RuntimeError("eagle needs the target's features: the loop passes them when needs_features is True")
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
        root = self._catch_up(ctx)  # (H,) predicted feature at the root
        catch_up = clock() - start
        draft = self._chain(ctx, root, gamma) if self.mode == "chain" else self._tree(ctx, root, gamma)
        draft.catch_up_seconds = catch_up
        return draft

    def _catch_up(self, ctx: DecodeContext) -> torch.Tensor:
        """Feed the queued (feature, next token) pairs; return the last output, the prediction at the root."""
        state = self.state
        crop(state.cache, state.real)
        features = torch.cat(state.pending) if len(state.pending) > 1 else state.pending[0]  # (m, H)
        start, m = state.real, state.pending_rows
        if len(ctx.tokens) < start + m + 1:
            raise RuntimeError(f"the context has {len(ctx.tokens)} tokens; features cover {start + m} positions")
        device = features.device
        tokens = torch.tensor(ctx.tokens[start + 1 : start + m + 1], dtype=torch.long, device=device)
        positions = torch.arange(start, start + m, device=device)
        mask = None if m == 1 else attention_mask(start, local_mask(m, [], features.dtype).to(device))
        hidden = self.forward(tokens[None], features[None], positions[None], mask, state.cache)[0]  # (m, H)
        state.real, state.pending, state.pending_rows = start + m, [], 0
        return hidden[-1]

    def _chain(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """gamma tokens: argmax at temperature 0, else sampled from the warped q (reported as q)."""
        model, sampling = self.model, ctx.sampling
        hidden, tokens, qs = root, [], []
        for i in range(gamma):
            logits = model.logits(hidden, self.linear)  # (V,), or (N,) over a reduced draft vocabulary
            if sampling.greedy:
                token = model.token_ids(logits.argmax().view(1))
            else:
                q = warp(logits, sampling)
                token = model.token_ids(torch.multinomial(q, 1, generator=ctx.generator))
                qs.append(q if model.vocab is None else model.vocab.full_q(q))  # zero outside the draft vocabulary
            tokens.append(token)
            if i + 1 < gamma:
                position = torch.full((1, 1), self.state.real + i, dtype=torch.long, device=root.device)
                hidden = self.forward(token[None], hidden[None, None], position, None, self.state.cache)[0, 0]
        return Draft.chain(torch.cat(tokens).cpu(), torch.stack(qs).cpu() if qs else None)

    def _tree(self, ctx: DecodeContext, root: torch.Tensor, gamma: int) -> Draft:
        """EAGLE-2 dynamic tree, scores from the drafter's log-probabilities at the sampling temperature."""
        temperature = ctx.sampling.temperature or 1.0
        feeder = TreeFeeder(self.model, self.forward, self.state, root, temperature, self.top_k, gamma)
        root_logp = torch.log_softmax(self.model.logits(root, self.linear).float() / temperature, dim=-1)
        tree = grow_tree(root_logp, feeder.step, gamma, self.top_k, self.total_tokens)
        return Draft(self.model.token_ids(tree.tokens).cpu(), tree.parents.cpu(), None)


class TreeFeeder:
    """Feeds chosen tree nodes to the drafter, one batched call per depth, under an ancestor mask over its cache."""

    def __init__(
        self, model: EagleModel, forward: Callable, state: DraftState, root: torch.Tensor, temperature: float,
        top_k: int, gamma: int,
    ) -> None:
        self.model, self.forward, self.state, self.root, self.temperature = model, forward, state, root, temperature
        device = root.device
        max_fed = top_k * max(gamma - 1, 0)
        max_candidates = top_k + max(gamma - 1, 0) * top_k * top_k
        self.slot_of = torch.full((max_candidates,), -1, dtype=torch.long, device=device)  # candidate -> fed slot
        self.hidden = root.new_empty(max_fed, root.shape[-1])  # (F, H) outputs of fed nodes
        self.ancestors = torch.zeros(max_fed, max_fed, dtype=torch.bool, device=device)  # among fed slots
        self.fed = 0
        self.depth = 0

    def step(self, nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Feed nodes (k,) of one depth; return their children's log-probabilities (k, V)."""
        k, fed, real = nodes.numel(), self.fed, self.state.real
        self.depth += 1
        has_parent = parents >= 0
        parent_slots = torch.where(has_parent, self.slot_of[parents.clamp(min=0)], 0)  # (k,)
        features = torch.where(has_parent[:, None], self.hidden[parent_slots], self.root)  # (k, H)
        new = torch.arange(fed, fed + k, device=nodes.device)
        rows = self.ancestors[parent_slots] & has_parent[:, None]  # (k, F)
        rows[torch.arange(k, device=nodes.device), new] = True
        self.ancestors[new] = rows
        mask = torch.zeros(1, 1, k, real + fed + k, dtype=features.dtype, device=nodes.device)
        mask[0, 0, :, real:] = additive(rows[:, : fed + k], features.dtype)
        positions = torch.full((1, k), real + self.depth - 1, dtype=torch.long, device=nodes.device)
        ids = self.model.token_ids(tokens)[None]  # the tree grows over draft-vocabulary indices
        hidden = self.forward(ids, features[None], positions, mask, self.state.cache)[0]  # (k, H)
        self.hidden[new] = hidden
        self.slot_of[nodes] = new
        self.fed = fed + k
        return torch.log_softmax(self.model.logits(hidden).float() / self.temperature, dim=-1)


def fast_forward(model: EagleModel, linear: Callable = torch.nn.functional.linear) -> Callable:
    """``model``'s forward through the lean layer whenever that reproduces the module path, multiplying with
    ``linear`` (``specfamily.core.matmul``: the target's kind)."""
    if lean_eagle_unsupported(model) is not None:
        return model
    lean = LeanEagleLayer(model, linear)
    return lambda *args: lean(*args) if lean.ready() else model(*args)


def _load(target: Target, config: EagleConfig) -> tuple[EagleModel, dict]:
    """The model and its calibration: fresh modules for weights="random", a built model as is, else the
    checkpoint (default: the zoo's eagle weights for this target) with the tree shape calibrated for it, if any."""
    if isinstance(config.weights, EagleModel):
        if config.weights.parts.lm_head is not target.model.get_output_embeddings():
            raise ValueError("this EagleModel was built for another target (it reads another model's LM head)")
        return config.weights, {}
    if config.weights == "random":
        ids = config.draft_vocab if isinstance(config.draft_vocab, list) else None
        vocab = None if ids is None else DraftVocab(torch.tensor(sorted(ids), dtype=torch.long), target.vocab_size)
        return build_model(target.model, seed=config.seed, vocab=vocab), {}
    weights = zoo.default_weights("eagle", target) if config.weights is None else config.weights
    model, saved = load_eagle(weights, target.model)
    if config.draft_vocab == "full":
        model.use_vocab(None)
    elif isinstance(config.draft_vocab, int):
        if model.vocab is None:
            raise ValueError("these eagle weights draft over the full vocabulary; draft_vocab=<size> restricts a "
                             "reduced one (train with --draft-vocab N)")
        model.use_vocab(model.vocab.restrict(config.draft_vocab))
    return model, saved.get("calibration") or {}
