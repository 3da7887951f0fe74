"""The adjacency table: each token's k most likely successors, as the target last scored them after that token."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from specfamily.core.host import to_host

_BLOCK = 64  # logits per block of the two-stage top-k (top_k)
PENDING_PASSES = 8  # idle batched passes whose rows wait to be scored (defer); older ones are dropped unscored


@dataclass
class AdjacencyTable:
    """successors (V, k): row x holds the top-k of the logits the target produced at a position holding token x
    (most likely first); scores (V, k): their probabilities there (softmax of those logits); known (V,): whether row
    x was ever written (unwritten rows propose nothing)."""

    successors: np.ndarray  # (V, k) int64
    known: np.ndarray  # (V,) bool
    scores: np.ndarray  # (V, k) float32
    pending: deque = field(default_factory=lambda: deque(maxlen=PENDING_PASSES), repr=False, compare=False)

    @classmethod
    def empty(cls, vocab_size: int, k: int) -> AdjacencyTable:
        return cls(np.zeros((vocab_size, k), dtype=np.int64), np.zeros(vocab_size, dtype=bool),
                   np.zeros((vocab_size, k), dtype=np.float32))

    @property
    def k(self) -> int:
        return self.successors.shape[1]

    def update(self, tokens: list[int], logits: torch.Tensor) -> None:
        """Rewrite the rows of ``tokens`` (n,) from ``logits`` (n, V'): row i is what followed tokens[i]. A token fed
        twice keeps its last row, as the reference's scatter does."""
        check_rows(tokens, logits)
        self.flush()
        self.write(tokens, *self.scored(logits))

    def defer(self, tokens: list[int], logits: torch.Tensor) -> None:
        """Keep a pass's rows (``logits``: a tensor nobody writes again, e.g. a view of the batched pass's own
        logits, which the batched loop allocates anew each pass) to be scored by the next :meth:`flush`: a batched
        pass on which no slot drafted. Of a run of idle passes the latest ``PENDING_PASSES`` are scored when the
        table is next read; older ones are dropped unscored (the rows of a table that drafts nothing under load cost
        a top-k and a softmax over the vocabulary each, every pass)."""
        check_rows(tokens, logits)
        self.pending.append((list(tokens), logits))

    def flush(self) -> None:
        """Score and write the deferred rows, oldest first (one top-k over all of them)."""
        if not self.pending:
            return
        tokens = [token for fed, _ in self.pending for token in fed]
        logits = joined_rows([rows for _, rows in self.pending])
        self.pending.clear()
        self.write(tokens, *self.scored(logits))

    def scored(self, logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(n, k) the top-k successors of each row of ``logits`` (n, V') and (n, k) their probabilities: the
        softmax's top-k, without writing a (n, V) softmax."""
        values, indices = top_k(logits, min(self.k, logits.shape[-1]))
        probs = torch.exp(values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True))
        indices, probs = to_host([indices, probs])  # one wait for both
        return indices.numpy(), probs.numpy()

    def write(self, tokens: list[int], successors: np.ndarray, scores: np.ndarray) -> None:
        """Rows ``tokens`` rewritten with ``scored``'s successors and probabilities (the last of a repeated token's
        rows winning)."""
        rows, k = np.asarray(tokens, dtype=np.int64), successors.shape[1]
        self.successors[rows, :k] = successors
        self.scores[rows, :k] = scores
        self.known[rows] = True


def joined_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` of 2-d row blocks, as a view without a copy where they are consecutive rows of one tensor
    (each slot's logits of one batched pass are: copying them cost recycling ~0.8 ms a pass at B=16 on 2 CPU threads,
    idle, docs/batching-log.md, session 36)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    storage, offset, stride = first.untyped_storage().data_ptr(), first.storage_offset(), first.stride()
    for part in parts:
        if part.dim() != 2 or part.stride() != stride or part.shape[1] != first.shape[1] or \
                part.dtype != first.dtype or part.untyped_storage().data_ptr() != storage or \
                part.storage_offset() != offset:
            return torch.cat(parts)
        offset += part.shape[0] * stride[0]
    rows = sum(part.shape[0] for part in parts)
    return first.as_strided((rows, first.shape[1]), stride, first.storage_offset())


def check_rows(tokens: list[int], logits: torch.Tensor) -> None:
    """Refuse logits whose rows are not one per fed token."""
    if logits.shape[0] != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {logits.shape[0]} rows of logits")


def top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(logits, k)`` over the last dimension of (n, V), in two stages: the k blocks of 64 logits with the
    largest maxima hold the top k (a logit of the top k lies in a block whose maximum is at least itself, and fewer
    than k logits are above it), then the top k of those blocks' 64 k logits: far less sorting work than one top-k
    over V. Values equal ``torch.topk``'s; where values tie, other indices of the same values may be chosen. A
    vocabulary not a multiple of 64, or under 4 k blocks, takes ``torch.topk`` itself."""
    n, vocab = logits.shape
    blocks = vocab // _BLOCK
    if vocab % _BLOCK or blocks < 4 * k:
        top = torch.topk(logits, k, dim=-1)
        return top.values, top.indices
    grouped = logits.reshape(n, blocks, _BLOCK)
    best = torch.topk(grouped.amax(-1), k, dim=-1).indices  # (n, k) the blocks holding the top k
    candidates = torch.gather(grouped, 1, best[..., None].expand(-1, -1, _BLOCK)).flatten(1)  # (n, k * 64)
    values, where = torch.topk(candidates, k, dim=-1)
    return values, best.gather(1, torch.div(where, _BLOCK, rounding_mode="floor")) * _BLOCK + where % _BLOCK
