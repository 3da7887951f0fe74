"""Pure verification math: chains and trees, sampled (q) or deterministic (q = None) proposals.

Recursive rejection sampling: at a node, try its children in order; a sampled child x ~ q is
accepted with probability min(1, p(x) / q(x)), and on rejection p <- norm(max(p - q, 0)); a
deterministic child is the case q = one-hot(x): accepted with probability p(x), and on rejection
p(x) <- 0 and p is renormalised. Accepting descends to the child's own row of p. When no child is
accepted the next token is sampled from what is left of p. Greedy decoding is the same code with
one-hot p. Exact: the committed tokens follow p whatever the drafter proposes.
"""

from __future__ import annotations

import torch


class DraftProbabilityError(ValueError):
    """A draft token its reported q gives probability 0: it was not sampled from the q the drafter reports."""


def _children(parents: list[int]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    return children


def _normalise(rejected: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """The residual after a rejection, renormalised; an all-zero one falls back to the current residual."""
    total = rejected.sum()
    if total <= 0:
        return _all_zero_fallback(current)
    return rejected / total


def _all_zero_fallback(current: torch.Tensor) -> torch.Tensor:
    """max(r - q, 0) is all zero only when the current residual r is q up to rounding (a rejection then has
    probability ~0): keep sampling from r, which already excludes every rejected sibling, never from the
    node's original p (which would bring rejected tokens back)."""
    return current / current.sum()


def _uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return torch.rand((), generator=generator, device=device, dtype=torch.float64).item()


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _try_child(
    residual: torch.Tensor, token: int, q_row: torch.Tensor | None, generator: torch.Generator | None
) -> tuple[bool, torch.Tensor]:
    """One rejection step against the current residual: (accepted, residual if rejected)."""
    if q_row is None:
        if _uniform(generator, residual.device) < residual[token].item():
            return True, residual
        rejected = residual.clone()
        rejected[token] = 0.0
        return False, rejected
    q_x = q_row[token].item()
    if q_x <= 0:
        raise DraftProbabilityError(f"draft token {token} has q = 0 under the distribution it was sampled from")
    if _uniform(generator, residual.device) < min(1.0, residual[token].item() / q_x):
        return True, residual
    return False, torch.clamp(residual - q_row, min=0.0)


def verify_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """Accept a path of a token tree against the target's p.

    tokens (n,), parents (n,), q (n, V) or None, p (n+1, V): row 0 at the root, row i+1 after node i.
    Returns (accepted node indices from the root down, the next token sampled by the target).
    """
    n = tokens.numel()
    if p.dim() != 2 or p.shape[0] != n + 1:
        raise ValueError(f"p must have shape (n + 1 = {n + 1}, V), got {tuple(p.shape)}")
    if q is not None and q.shape != (n, p.shape[1]):
        raise ValueError(f"q must have shape ({n}, {p.shape[1]}), got {tuple(q.shape)}")
    p64 = p.double()
    q64 = q.double() if q is not None else None
    token_list = tokens.tolist()
    children = _children(parents.tolist())
    path: list[int] = []
    node, residual = -1, p64[0]
    while True:
        accepted = None
        for child in children.get(node, []):
            ok, rejected = _try_child(residual, token_list[child], None if q64 is None else q64[child], generator)
            if ok:
                accepted = child
                break
            residual = _normalise(rejected, residual)
        if accepted is None:
            return path, _sample(residual, generator)
        path.append(accepted)
        node, residual = accepted, p64[accepted + 1]


def verify_chain(
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Speculative sampling over a chain: (number accepted, the next token).

    draft_tokens (g,), q (g, V) or None, p (g+1, V): row i at draft position i, row g the bonus.
    """
    g = draft_tokens.numel()
    path, next_token = verify_tree(draft_tokens, torch.arange(g) - 1, q, p, generator)
    return len(path), next_token


def greedy_tree(tokens: torch.Tensor, parents: torch.Tensor, target_argmax: torch.Tensor) -> tuple[list[int], int]:
    """verify_tree with one-hot p, without building p: target_argmax (n+1,) is the argmax per row.

    Returns exactly what verify_tree returns for p = one-hot(target_argmax).
    """
    token_list, parent_list, best = tokens.tolist(), parents.tolist(), target_argmax.tolist()
    path: list[int] = []
    node = -1
    for child, parent in enumerate(parent_list):
        # children of a node come after it; the first matching child in index order wins
        if parent == node and token_list[child] == best[node + 1]:
            path.append(child)
            node = child
    return path, best[node + 1]
