"""Hydra drafter (Ankner et al. 2024): sequentially dependent heads propose a Medusa-style token tree.

Alignment as Medusa's: the last feature handed to ``observe`` is at R - 1 (R: the root) and the root token is the last
committed one. The tree is grown depth by depth: head d - 1 runs once per node of depth d - 1 that has children (the
root for d = 1), on the feature, the root's embedding and the embeddings of the tokens on the node's path, and the
node's children are the ranks the tree asks for in that head's top-k. Siblings come from one top-k, so they are
distinct and the proposal is deterministic (q = None). The first pass has no feature: an empty draft.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from specfamily.core.context import DecodeContext
from specfamily.core.costs import process_clock
from specfamily.core.types import Draft, VerifyOutcome
from specfamily.drafters.medusa.drafter import HeadsDrafter
from specfamily.drafters.medusa.hydra_checkpoint import HYDRA
from specfamily.drafters.medusa.hydra_config import HydraConfig
from specfamily.drafters.medusa.hydra_heads import PREFIX_RANK, HydraHeads, HydraShape, hydra_shape_for
from specfamily.drafters.medusa.tree import MedusaTree
from specfamily.runtime.matmul import linear_for


@dataclass(frozen=True)
class Level:
    """How depth d is drafted: the expanded nodes of depth d - 1 (their ancestors, depth 1 first), and for each node
    of depth d the row of its parent among them and its rank."""

    ancestors: torch.Tensor  # (m, d - 1) node indices: the path of each expanded parent (m = 1, width 0 at d = 1)
    rows: torch.Tensor  # (n_d,) row of each node's parent in ``ancestors``
    ranks: torch.Tensor  # (n_d,)
    nodes: slice  # the nodes of depth d in the tree's order
    top_k: int  # 1 + the largest rank at this depth


def tree_levels(tree: MedusaTree) -> list[Level]:
    """The per-depth drafting plan of a tree (buffers built once)."""
    parents, levels = tree.parents.tolist(), []
    for d in range(1, tree.depth + 1):
        nodes = range(tree.prefix[d - 1], tree.prefix[d])
        expanded = sorted({parents[i] for i in nodes})
        paths = []
        for p in expanded:
            path = []
            while p >= 0:
                path.append(p)
                p = parents[p]
            paths.append(path[::-1])
        ancestors = torch.tensor(paths, dtype=torch.long).reshape(len(expanded), d - 1)
        rows = torch.tensor([expanded.index(parents[i]) for i in nodes], dtype=torch.long)
        ranks = tree.ranks[tree.prefix[d - 1] : tree.prefix[d]]
        levels.append(Level(ancestors, rows, ranks, slice(tree.prefix[d - 1], tree.prefix[d]), int(ranks.max()) + 1))
    return levels


class HydraDrafter(HeadsDrafter):
    """Proposes a token tree from K Hydra heads; q = None (deterministic). Options as Medusa's (no typical rule)."""

    family, kind, config_class = "hydra", HYDRA, HydraConfig

    def __init__(self, target, weights=None, gamma: int | None = None, policy: str | None = None, tree=None,
                 num_heads: int = 4, layers: int = 1, share_lm_head: bool = False, quantize: int = 0,
                 prefix_rank: int = PREFIX_RANK) -> None:
        self._load(target, HydraConfig(weights, gamma, policy, tree, num_heads, layers, share_lm_head, quantize,
                                       prefix_rank))

    @staticmethod
    def random_shape(target, cfg: HydraConfig) -> HydraShape:
        return hydra_shape_for(target, cfg.num_heads, cfg.layers, cfg.share_lm_head, prefix_rank=cfg.prefix_rank)

    def _setup(self, target, heads: HydraHeads, meta, cfg: HydraConfig) -> None:
        super()._setup(target, heads, meta, cfg)
        device = target.device
        self.levels = [Level(lv.ancestors.to(device), lv.rows.to(device), lv.ranks.to(device), lv.nodes, lv.top_k)
                       for lv in tree_levels(self.tree)]
        self.parents = self.tree.parents  # on the host, as every draft's: the verifier reads them there
        self._root: int | None = None
        self._linear = None if target.matmul == "exact" else linear_for(target.matmul)
        self._warm_up(target)

    def _warm_up(self, target) -> None:
        """One full tree at load, from a zero feature: a fresh drafter's first tree cost ~60 ms more than the next
        (SmolLM2's heads, 5 ms warm: docs/batching-log.md, session 32), which its first drafted pass would otherwise pay
        and the length policy count as that pass's cost (as small_model's draft model warms up at load)."""
        feature = torch.zeros(self.heads.shape.hidden_size, device=target.device, dtype=target.dtype)
        self.draft_tokens(feature, 0, self.tree.depth)

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self._root = None

    @torch.inference_mode()
    def draft_tokens(self, feature: torch.Tensor, root: int, depth: int) -> torch.Tensor:
        """(prefix[depth],) target ids of the tree cut at ``depth``, grown from ``feature`` (H,) and the root."""
        heads, n = self.heads, self.tree.prefix[depth]
        tokens = torch.empty(n, dtype=torch.long, device=feature.device)
        emb = torch.empty(n, feature.shape[-1], dtype=feature.dtype, device=feature.device)
        root_id = torch.tensor([root]).to(feature.device, non_blocking=True)  # queued, not waited on
        base = torch.cat([feature, heads.embed(root_id)[0].to(feature.dtype)])
        for d, level in enumerate(self.levels[:depth], start=1):
            m = level.ancestors.shape[0]
            path = emb[level.ancestors.reshape(-1)].reshape(m, (d - 1) * feature.shape[-1])
            x = torch.cat([base.expand(m, -1), path], dim=-1)  # (m, (d + 1) H)
            top = heads.head_logits(d - 1, x, self._linear).topk(level.top_k, dim=-1).indices  # (m, top_k)
            chosen = heads.token_ids(top[level.rows, level.ranks])
            tokens[level.nodes] = chosen
            emb[level.nodes] = heads.embed(chosen).to(feature.dtype)
        return tokens

    def propose(self, ctx: DecodeContext, gamma: int) -> Draft:
        if self._feature is None:  # first pass: nothing processed yet, plain prefill
            return Draft.empty()
        depth = min(gamma, self.tree.depth)
        return Draft(self.draft_tokens(self._feature, self._root, depth), self.parents[: self.tree.prefix[depth]])

    def observe(self, outcome: VerifyOutcome) -> None:
        """Keep the feature of the last processed position on the committed path and the new root token."""
        if outcome.features is None or outcome.features.shape[0] == 0:
            raise RuntimeError("the Hydra drafter needs the target's features in observe (needs_features=True)")
        self._feature, self._root = outcome.features[-1], outcome.tokens[-1]


def measure_hydra_cost(drafter: HydraDrafter, seconds_per_pass: float, repeats: int = 20) -> float:
    """c: time of one full-tree proposal relative to one target pass t(1)."""
    param = next(drafter.heads.parameters())
    feature = torch.zeros(drafter.heads.shape.hidden_size, device=param.device, dtype=param.dtype)
    clock = process_clock(feature.device)
    times = []
    for _ in range(repeats):
        started = clock()
        drafter.draft_tokens(feature, 0, drafter.tree.depth)
        times.append(clock() - started)
    return statistics.median(times) / seconds_per_pass

