"""Several drafters' token trees as one (SpecInfer's merged token tree), with the q the verifier's law needs.

The verifier tries a node's children in index order, each against the law its q row reports (:mod:`verify`), so a
merged tree is exact when every node's row is the law of its token given everything laid before it. The parts draw
independently of each other; their trees are laid into one trie, part after part, each part's nodes in its own
order (parents before children, siblings in the order they were drawn):

- a node whose path is already in the trie is merged into the node there, which keeps the row of the draw that put
  it there first: that draw's law is untouched by later, independent draws;
- a node new at its parent was drawn on the condition that it is none of the tokens already there (S), so a sampled
  node reports its part's row with S removed and renormalised, q(x | x not in S), as siblings drawn without
  replacement do; a deterministic node (its part's q is None) stays one-hot.

Merged siblings therefore carry distinct tokens, and the merge of a single draft is that draft with its duplicate
siblings folded. The q of the merged draft is None when every part's is, else (n, V) with one-hot rows for the
deterministic nodes (the verifier's rule for a one-hot row is its deterministic rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfamily.core.types import Draft


@dataclass(frozen=True)
class Source:
    """The draw that put a merged node there: node ``node`` of part ``part``, and the tokens already at its parent
    then (``excluded``), which its row gives probability 0."""

    part: int
    node: int
    excluded: tuple[int, ...] = ()


@dataclass
class MergedTree:
    """The merged draft; per part, the merged node each of its nodes was laid at (``at[k][i]``) and its own
    parents; per merged node, the draw whose row it reports."""

    draft: Draft
    at: list[list[int]]
    part_parents: list[list[int]]
    sources: list[Source]  # (n,)

    def part_path(self, part: int, path: Sequence[int]) -> list[int]:
        """Part ``part``'s own nodes along a merged path (node indices from the root down), as far as its tree
        follows it: what that part alone would have had accepted."""
        parents = self.part_parents[part]
        landed: dict[int, list[int]] = {}
        for i, node in enumerate(self.at[part]):
            landed.setdefault(node, []).append(i)
        own: list[int] = []
        for node in path:
            above = own[-1] if own else -1
            step = next((i for i in landed.get(node, []) if parents[i] == above), None)
            if step is None:
                break
            own.append(step)
        return own


def conditional_row(q_row: torch.Tensor, excluded: Sequence[int]) -> torch.Tensor:
    """q(x | x not in ``excluded``): the row with those tokens at 0, renormalised in float64 (the row as it is
    when nothing is excluded)."""
    if not excluded:
        return q_row
    row = q_row.double().clone()
    row[list(excluded)] = 0.0
    return (row / row.sum()).to(q_row.dtype)


def merge_drafts(drafts: Sequence[Draft], vocab_size: int) -> MergedTree:
    """Lay ``drafts`` (in their order) into one trie; see the module docstring for the law each row reports."""
    tokens: list[int] = []
    parents: list[int] = []
    sources: list[Source] = []
    child_of: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    siblings: dict[int, list[int]] = {}  # merged parent -> its children's tokens, in order
    at: list[list[int]] = []
    part_parents: list[list[int]] = []
    for k, draft in enumerate(drafts):
        own_parents = draft.parents.tolist()
        landed: list[int] = []
        for i, (token, parent) in enumerate(zip(draft.tokens.tolist(), own_parents, strict=True)):
            above = -1 if parent < 0 else landed[parent]
            node = child_of.get((above, token))
            if node is None:
                node = child_of[above, token] = len(tokens)
                there = siblings.setdefault(above, [])
                sources.append(Source(k, i, tuple(there)))
                there.append(token)
                tokens.append(token)
                parents.append(above)
            landed.append(node)
        at.append(landed)
        part_parents.append(own_parents)
    merged = Draft(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                   merged_q(drafts, sources, tokens, vocab_size))
    return MergedTree(merged, at, part_parents, sources)


def merged_q(drafts: Sequence[Draft], sources: Sequence[Source], tokens: Sequence[int],
             vocab_size: int) -> torch.Tensor | None:
    """(n, V) each merged node's row: its source's row given its excluded tokens, one-hot where the source is
    deterministic; None when no part reported a q."""
    sampled = [draft.q for draft in drafts if draft.q is not None]
    if not sampled:
        return None
    dtype = sampled[0].dtype
    for q in sampled[1:]:
        dtype = torch.promote_types(dtype, q.dtype)
    device = sampled[0].device
    q = torch.zeros(len(sources), vocab_size, dtype=dtype, device=device)
    for row, source in enumerate(sources):
        part_q = drafts[source.part].q
        if part_q is None:
            q[row, tokens[row]] = 1.0
        else:
            q[row] = conditional_row(part_q[source.node].to(device=device, dtype=dtype), source.excluded)
    return q
