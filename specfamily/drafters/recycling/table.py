"""The adjacency table: each token's k most likely successors, as the target last scored them after that token."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AdjacencyTable:
    """successors (V, k): row x holds the top-k of the logits the target produced at a position holding token x
    (most likely first); scores (V, k): their probabilities there (softmax of those logits); known (V,): whether row
    x was ever written (unwritten rows propose nothing)."""

    successors: np.ndarray  # (V, k) int64
    known: np.ndarray  # (V,) bool
    scores: np.ndarray  # (V, k) float32

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
        if logits.shape[0] != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {logits.shape[0]} rows of logits")
        k = min(self.k, logits.shape[-1])
        top = torch.topk(logits, k, dim=-1)  # the softmax's top-k, without writing a (n, V) softmax every pass
        probs = torch.exp(top.values.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True))
        rows = np.asarray(tokens, dtype=np.int64)
        self.successors[rows, :k] = top.indices.cpu().numpy()
        self.scores[rows, :k] = probs.cpu().numpy()
        self.known[rows] = True
