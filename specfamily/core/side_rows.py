"""Side rows: tokens a drafter adds to a verification pass to read the target's view of its own guesses.

A draft's side rows ride in the same target pass as its verification rows (the pending tokens and the draft tree)
but are never verified and never committed: they see the committed prefix (the cache and the pending tokens) and
the side rows their own ``visible`` mask names, nothing of the draft tree; no verification row sees them (so p is
exactly what it would be without them); they are removed from the cache when the pass is committed; their logits go
back to the drafter (``VerifyOutcome.side_logits``). Lookahead decoding's Jacobi window is the first user.

Fed order in the pass: the m pending tokens, the n draft nodes, then the s side rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specfamily.core.tree_mask import PrefixMask, TreeLayout, additive, tree_ancestors, tree_positions

__all__ = ["SideRows", "side_key", "side_layout", "side_visibility"]


@dataclass
class SideRows:
    """s tokens fed after the draft tree, each at position root + ``depths[i]``, seeing the committed prefix and the
    side rows ``visible[i]`` names (its own branch: itself and earlier side rows only)."""

    tokens: torch.Tensor  # (s,) long
    depths: torch.Tensor  # (s,) long >= 1: position offset from the root (the root's children have depth 1)
    visible: torch.Tensor  # (s, s) bool: [i, j] side row i sees side row j; the diagonal set, nothing above it

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).reshape(-1)
        self.depths = torch.as_tensor(self.depths, dtype=torch.long).reshape(-1).cpu()
        self.visible = torch.as_tensor(self.visible, dtype=torch.bool).cpu()
        s = self.tokens.numel()
        if s == 0:
            raise ValueError("side rows need at least one token (use side=None for none)")
        if self.depths.numel() != s:
            raise ValueError(f"side rows have {s} tokens but {self.depths.numel()} depths")
        if bool((self.depths < 1).any()):
            raise ValueError(f"side row depths must be >= 1 (the root's children have depth 1), got "
                             f"{self.depths.tolist()}")
        if tuple(self.visible.shape) != (s, s):
            raise ValueError(f"side rows' visible mask must have shape ({s}, {s}), got {tuple(self.visible.shape)}")
        if not bool(self.visible.diagonal().all()):
            raise ValueError("side rows' visible mask must let every side row see itself")
        if bool(self.visible.triu(1).any()):
            raise ValueError("a side row may see only itself and earlier side rows (visible must be lower-triangular)")

    def __len__(self) -> int:
        return self.tokens.numel()

    @classmethod
    def branches(cls, tokens, parents: Sequence[int] | torch.Tensor) -> SideRows:
        """Side rows shaped as a token tree over the root (``parents`` as a Draft's): each sees its ancestors."""
        ancestors = tree_ancestors(parents)
        return cls(tokens, tree_positions(parents), ancestors)


def side_key(side: SideRows) -> tuple:
    """A hashable key of the side rows' shape (depths and mask), for caching a pass's layout."""
    return tuple(side.depths.tolist()), side.visible.numpy().tobytes()


def side_visibility(m: int, parents: torch.Tensor | Sequence[int], side: SideRows) -> torch.Tensor:
    """(m + n + s, m + n + s) bool: who sees whom among the pending tokens, the draft nodes and the side rows.

    Pending tokens are causal among themselves; a draft node sees every pending token, its ancestors and itself;
    a side row sees every pending token and the side rows ``side.visible`` names. No draft node sees a side row and no
    side row sees a draft node."""
    ancestors = tree_ancestors(parents)
    n, s = ancestors.shape[0], len(side)
    visible = torch.zeros(m + n + s, m + n + s, dtype=torch.bool)
    visible[:m, :m] = torch.ones(m, m, dtype=torch.bool).tril_()
    visible[m:, :m] = True
    visible[m : m + n, m : m + n] = ancestors
    visible[m + n :, m + n :] = side.visible
    return visible


def side_layout(m: int, parents: Sequence[int], side: SideRows, dtype: torch.dtype,
                device: torch.device | str | None = None) -> TreeLayout:
    """The mask block and position offsets for m pending tokens, the tree ``parents`` and the side rows."""
    tree = torch.as_tensor(parents, dtype=torch.long).reshape(-1)
    local = additive(side_visibility(m, tree, side), dtype).to(device)
    offsets = torch.cat((torch.arange(m), m - 1 + tree_positions(tree), m - 1 + side.depths))
    return TreeLayout(local, offsets.to(device), False, PrefixMask(local))
