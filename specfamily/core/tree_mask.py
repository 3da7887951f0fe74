"""Token-tree attention helpers: depths, ancestor sets and additive masks for a draft tree.

Pure functions on ``parents`` (n,) with -1 for children of the root and ``parents[i] < i``. They are shared by
the target wrapper and by drafters that run their own layers over a tree (self-speculation, EAGLE).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "BUFFER_MAX_ROWS",
    "PrefixMask",
    "TreeLayout",
    "additive",
    "attention_mask",
    "is_chain",
    "local_mask",
    "tree_ancestors",
    "tree_layout",
    "tree_mask",
    "tree_positions",
]


def _as_parents(parents: torch.Tensor | Sequence[int], device: torch.device | str | None = None) -> torch.Tensor:
    return torch.as_tensor(parents, dtype=torch.long, device=device).reshape(-1)


def tree_ancestors(parents: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """(n, n) bool: ``[i, j]`` is True when node j is node i or one of its ancestors (the root excluded)."""
    parents = _as_parents(parents)
    n = parents.numel()
    eye = torch.eye(n, dtype=torch.bool, device=parents.device)
    if n == 0:
        return eye
    has_parent = parents >= 0
    step = torch.zeros(n, n, dtype=torch.bool, device=parents.device)  # [i, parent(i)]
    step[has_parent, parents.clamp(min=0)[has_parent]] = True
    reach = (eye | step).to(torch.float32)
    for _ in range(max(1, math.ceil(math.log2(n)))):  # closure by squaring: paths of length <= 2^k
        reach = (reach @ reach).clamp_(max=1.0)
    return reach.bool()


def tree_positions(parents: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """(n,) long depth of each node; children of the root have depth 1 (the position offset from the root)."""
    return tree_ancestors(parents).sum(dim=-1)


def additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean visibility matrix as an additive mask: 0 where visible, ``finfo(dtype).min`` where hidden."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def tree_mask(parents: torch.Tensor | Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, n) additive mask among draft nodes: a node sees its ancestors and itself."""
    return additive(tree_ancestors(parents), dtype)


def is_chain(parents: Sequence[int]) -> bool:
    """True when ``parents`` is [-1, 0, 1, ...]."""
    return all(p == i - 1 for i, p in enumerate(parents))


def local_mask(m: int, parents: torch.Tensor | Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """(m + n, m + n) additive mask over the m pending tokens then the n nodes (the cached prefix not included).

    Pending tokens are causal among themselves; a node sees every pending token, its ancestors and itself.
    """
    ancestors = tree_ancestors(parents)
    n = ancestors.shape[0]
    visible = torch.zeros(m + n, m + n, dtype=torch.bool, device=ancestors.device)
    visible[:m, :m] = torch.ones(m, m, dtype=torch.bool, device=ancestors.device).tril_()
    visible[m:, :m] = True
    visible[m:, m:] = ancestors
    return additive(visible, dtype)


def attention_mask(prefix_len: int, local: torch.Tensor) -> torch.Tensor:
    """(1, 1, q, prefix_len + q) additive mask: every cached position visible, then ``local`` (q, q)."""
    q = local.shape[0]
    mask = torch.zeros(1, 1, q, prefix_len + q, dtype=local.dtype, device=local.device)
    mask[0, 0, :, prefix_len:] = local
    return mask


BUFFER_MAX_ROWS = 32  # passes of more fed tokens (prefills, wide trees) build their mask per pass


@dataclass
class PrefixMask:
    """``attention_mask(prefix_len, local)`` for every prefix length, as views of one buffer that grows with the
    cache: ``[0 ... 0 | local]`` along the keys, so a pass over a longer cache takes a wider view, not a new tensor.

    A view's rows are strided (the buffer's width); what it holds equals ``attention_mask``'s. Local masks of more
    than ``BUFFER_MAX_ROWS`` rows are built per call, not kept, and so is every mask off the CPU: CUDA's fused
    attention kernels read the mask with vector loads that need its rows to start 16-byte aligned, which a view at
    an arbitrary offset is not (a misaligned-address fault on an H200), and a fresh mask there is one small kernel."""

    local: torch.Tensor  # (q, q) additive
    buffer: torch.Tensor | None = None  # (1, 1, q, capacity + q)

    @property
    def capacity(self) -> int:
        """The longest prefix the buffer holds."""
        return 0 if self.buffer is None else self.buffer.shape[-1] - self.local.shape[0]

    def __call__(self, prefix_len: int) -> torch.Tensor:
        """(1, 1, q, prefix_len + q): every cached position visible, then ``local``."""
        if self.local.shape[0] > BUFFER_MAX_ROWS or self.local.device.type != "cpu":
            return attention_mask(prefix_len, self.local)
        if self.buffer is None or prefix_len > self.capacity:
            self.buffer = attention_mask(max(prefix_len + prefix_len // 2, 64), self.local)
        return self.buffer[..., self.capacity - prefix_len :]


@dataclass(frozen=True)
class TreeLayout:
    """Per-shape tensors of one pass over m pending tokens and a tree, built once and reused."""

    local: torch.Tensor  # (m + n, m + n) additive mask, model dtype, on the model's device
    offsets: torch.Tensor  # (m + n,) long: position of each fed token minus the first pending position
    chain: bool
    mask: PrefixMask  # the pass's whole mask by cached length, from a buffer kept with the layout
    seen: torch.Tensor | None = None  # (m + n, m + n) bool: where ``local`` is 0 (None: not kept)

    def visible(self, prefix_len: int) -> torch.Tensor | None:
        """(q, prefix_len + q) contiguous bool: every cached position, then ``seen``: where ``mask(prefix_len)`` is
        0, as the attention kernel takes it (``runtime.attention.kernel_visible``), without reading the mask back."""
        if self.seen is None:
            return None
        rows = self.seen.shape[0]
        out = torch.ones(rows, prefix_len + rows, dtype=torch.bool, device=self.seen.device)
        out[:, prefix_len:] = self.seen
        return out


def tree_layout(
    m: int, parents: Sequence[int], dtype: torch.dtype, device: torch.device | str | None = None
) -> TreeLayout:
    """The mask block and position offsets for m pending tokens followed by the tree ``parents``."""
    tree = _as_parents(parents)
    local = local_mask(m, tree, dtype)
    offsets = torch.cat((torch.arange(m), m - 1 + tree_positions(tree)))
    local = local.to(device, non_blocking=True)  # queued, not waited on (host.to_device)
    return TreeLayout(local, offsets.to(device, non_blocking=True), is_chain(parents), PrefixMask(local), local == 0)
