"""Medusa-1 drafter (Cai et al. 2024): K heads on the frozen target's last feature propose a token tree.

Alignment: the last feature row handed to ``observe`` is at position R - 1 (R: the root, the last committed token),
so head k predicts the token at R + 1 + k: head 0 proposes depth 1, head d - 1 depth d, as the heads are trained
(head k at position t predicts t + 2 + k). The first pass has no feature: an empty draft.

The node at rank path (r1, ..., rd) carries the rank-rd token of head d - 1. Siblings come from one head's top-k, so
they are distinct and the proposal is deterministic (q = None). Heads over a reduced draft vocabulary propose their
target ids (``MedusaHeads.token_ids``).
"""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar

import torch

from specfamily import zoo
from specfamily.core.context import DecodeContext
from specfamily.core.drafter import BaseDrafter
from specfamily.core.types import Draft, SamplingConfig, VerifyOutcome
from specfamily.core.typical import typical_accept
from specfamily.drafters.medusa.checkpoint import MEDUSA, HeadsFormat, MedusaCheckpoint, load_checkpoint
from specfamily.drafters.medusa.config import MedusaConfig
from specfamily.drafters.medusa.heads import HeadSet, HeadsShape, MedusaHeads, shape_for
from specfamily.drafters.medusa.tree import MedusaTree, build_tree, chain_paths, greedy_paths, nominal_accuracies
from specfamily.drafters.shared.quantize import quantize_heads
from specfamily.runtime.matmul import linear_for

RANDOM_TREE_NODES = 16  # default tree size for uncalibrated heads (a CPU-sized tree)


def resolve_tree(tree, num_heads: int, vocab_size: int, meta: MedusaCheckpoint | None, gamma: int | None) -> MedusaTree:
    """The tree option as buffers: None = default, "chain" = top-1 chain, else rank paths; checked against K, V."""
    if tree is None and meta is not None and meta.tree:  # the checkpoint's calibrated tree
        paths = [tuple(p) for p in meta.tree]
    elif tree is None:  # a nominal CPU-sized tree for heads without calibration
        paths = greedy_paths(nominal_accuracies(num_heads, min(8, vocab_size)), RANDOM_TREE_NODES)
    elif isinstance(tree, str) and tree == "chain":
        paths = chain_paths(num_heads if gamma is None else min(gamma, num_heads))
    else:
        paths = tree
    built = build_tree(paths)
    if built.depth > num_heads:
        raise ValueError(f"tree depth {built.depth} exceeds the number of Medusa heads ({num_heads})")
    if built.top_k > vocab_size:
        raise ValueError(f"tree uses rank {built.top_k - 1}, outside the vocabulary of {vocab_size} tokens")
    return built


class HeadsDrafter(BaseDrafter):
    """What Medusa's and Hydra's drafters share: heads from the options (the zoo's, a checkpoint or random), the tree
    they draft, the feature that produced the root. Subclasses name their family, checkpoint format and options."""

    needs_features = True
    default_gamma = 4
    auto_max_gamma = None  # cost-aware depths stay within the calibrated tree
    # read-only after setup: batch slot copies share them (copying the checkpoint's metadata and the tree cost most
    # of a slot's copy; docs/batching-log.md, session 26)
    batch_shared = ("checkpoint", "tree", "_gather", "_head_options")
    family: ClassVar[str]
    kind: ClassVar[HeadsFormat]
    config_class: ClassVar[type]

    def _load(self, target, cfg) -> None:
        """Heads as ``cfg`` asks: the zoo's for this target by default, fresh ones for weights='random', else a
        checkpoint's, whose shape wins (a shape option that conflicts with it is refused)."""
        weights = zoo.default_weights(self.family, target) if cfg.weights is None else cfg.weights
        if isinstance(weights, str) and weights == "random":
            heads, checkpoint = self.kind.build(target, self.random_shape(target, cfg), None).eval(), None
        else:
            heads, checkpoint = load_checkpoint(weights, target, self.kind)
            for name in [f.name for f in fields(heads.shape) if f.name in {g.name for g in fields(cfg)}]:
                value, saved = getattr(cfg, name), getattr(heads.shape, name)
                if value != getattr(type(cfg), name) and value != saved:
                    raise ValueError(f"{name}={value!r} conflicts with the checkpoint's {name}={saved!r} "
                                     "(shape options apply to weights='random')")
        self._setup(target, heads, checkpoint, cfg)

    @staticmethod
    def random_shape(target, cfg) -> HeadsShape:
        return shape_for(target, cfg.num_heads, cfg.layers, cfg.share_lm_head)

    @classmethod
    def from_heads(cls, target, heads: HeadSet, tree=None, **options) -> HeadsDrafter:
        """A drafter over heads already in memory (training, calibration); ``options`` as for the constructor."""
        drafter = cls.__new__(cls)
        drafter._setup(target, heads, None, cls.config_class(weights="random", tree=tree, **options))
        return drafter

    def _setup(self, target, heads: HeadSet, checkpoint: MedusaCheckpoint | None, cfg) -> None:
        if cfg.quantize:
            heads = quantize_heads(heads)
        self.heads, self.checkpoint = heads, checkpoint
        k = heads.shape.num_heads
        if cfg.gamma is not None and cfg.gamma > k:
            raise ValueError(f"gamma (tree depth) {cfg.gamma} exceeds the number of {self.kind.name} heads ({k})")
        self.tree = resolve_tree(cfg.tree, k, heads.shape.output_size, checkpoint, cfg.gamma)
        self.default_gamma = self.tree.depth
        super().__init__(cfg.gamma, cfg.policy)
        self._feature: torch.Tensor | None = None  # (H,) feature that produced the current root

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self._feature = None


class MedusaDrafter(HeadsDrafter):
    """Proposes a token tree from K Medusa heads over the target's last feature; q = None (deterministic)."""

    family, kind, config_class = "medusa", MEDUSA, MedusaConfig

    def __init__(self, target, weights=None, gamma: int | None = None, policy: str | None = None, tree=None,
                 num_heads: int = 4, layers: int = 1, share_lm_head: bool = False, typical: bool = False,
                 epsilon: float = 0.09, delta: float | None = None, quantize: int = 0) -> None:
        self._load(target, MedusaConfig(weights, gamma, policy, tree, num_heads, layers, share_lm_head, typical,
                                        epsilon, delta, quantize))

    def _setup(self, target, heads: MedusaHeads, checkpoint: MedusaCheckpoint | None, cfg: MedusaConfig) -> None:
        super()._setup(target, heads, checkpoint, cfg)
        self.lossy = cfg.typical  # typical acceptance does not preserve the target distribution
        self.epsilon, self.delta = cfg.epsilon, cfg.delta
        self._gather = self.tree.gather.to(target.device)  # (n,)
        self._token_ids = heads.token_ids if heads.shape.draft_vocab else None  # draft index -> target id
        # the shared head multiplied as the target multiplies (only passed when that is not F.linear: heads
        # written for the drafter before it took a ``linear`` keep working)
        self._head_options = {} if target.matmul == "exact" else {"linear": linear_for(target.matmul)}
        if target.matmul == "stream":
            self._pack_products(target)

    def _pack_products(self, target) -> None:
        """One dry call of every head, so the stream kernel packs the shared projection's weight now, with the heads'
        loading, not on the first proposal of the drafter's first run (the kernel packs a weight on its first product
        and keeps the copy on it; docs/batching-log.md, session 29)."""
        with torch.no_grad():
            features = torch.zeros(2, self.heads.shape.hidden_size, dtype=target.dtype, device=target.device)
            self.heads(features, **self._head_options)

    @torch.inference_mode()
    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        if self._feature is None:  # first pass: nothing processed yet, plain prefill
            return Draft.empty()
        depth = min(gamma, self.tree.depth)
        logits = self.heads(self._feature, depth, **self._head_options)  # (depth, V), or (depth, N) over draft ids
        return self._tree_draft(logits.topk(self.tree.top_k, dim=-1).indices)

    def _tree_draft(self, top: torch.Tensor) -> Draft:
        """The tree cut at depth ``len(top)`` from the heads' top-k ids (depth, top_k)."""
        n = self.tree.prefix[top.shape[0]]
        tokens = top.reshape(-1).index_select(0, self._gather[:n])  # (n,)
        if self._token_ids is not None:
            tokens = self._token_ids(tokens)
        return Draft(tokens, self.tree.parents[:n])

    @torch.inference_mode()
    def propose_batch(self, drafters: list[MedusaDrafter], ctxs: list[DecodeContext], gammas: list[int]) -> list[Draft]:
        """Batched decoding: one heads call over every drafting slot's feature (stacked), each slot's tree cut at
        its own depth (slots before their first feature, or at gamma 0, draft nothing)."""
        drafts = [Draft.empty() for _ in drafters]
        live = [i for i, (d, g) in enumerate(zip(drafters, gammas, strict=True)) if g > 0 and d._feature is not None]
        if not live:
            return drafts
        depths = [min(gammas[i], self.tree.depth) for i in live]
        features = torch.stack([drafters[i]._feature for i in live])  # (B, H)
        logits = self.heads(features, max(depths), **self._head_options)  # (depth, B, V) or (depth, B, N)
        top = logits.topk(self.tree.top_k, dim=-1).indices  # (depth, B, top_k)
        for j, (i, depth) in enumerate(zip(live, depths, strict=True)):
            drafts[i] = self._tree_draft(top[:depth, j])
        return drafts

    def observe(self, outcome: VerifyOutcome) -> None:
        """Keep the feature of the last processed position on the committed path: it produced the new root."""
        if outcome.features is None or outcome.features.shape[0] == 0:
            raise RuntimeError("the Medusa drafter needs the target's features in observe (needs_features=True)")
        self._feature = outcome.features[-1]

    def accept(self, draft: Draft, logits: torch.Tensor, sampling: SamplingConfig,
               generator: torch.Generator) -> tuple[list[int], int]:
        """Typical acceptance (lossy) over ``draft`` given the target's logits (n + 1, V).

        The shared loop calls this in place of the exact verifier when the drafter is lossy (``typical=True``).
        """
        return typical_accept(draft.tokens, draft.parents, logits, sampling, generator, self.epsilon, self.delta)
