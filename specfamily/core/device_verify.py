"""The verifier's walk on the tensors' own device: no host synchronisation until the result, then exactly one.

The same law as the host walk (:mod:`specfamily.core.verify`), written without a branch on a drawn value: every
node is visited once in index order, and takes part only when its parent is the node the walk stands on (children
come after their parent and siblings in the order they were drawn, so this visits exactly the children the host walk
tries, in its order). A tried node gets its own uniform u[i]; the final token inverts u[n] through the residual's
cumulative sum. Everything stays a tensor on p's device; only the packed result (accept mask, next token, what a
refused q needs for its error) crosses to the host, in one copy.

A chain is verified in one block: the accept test of every node at once (u_i < min(1, p_i(x_i) / q_i(x_i))), the
first rejection k from their running product, the residual of row k computed once. Its law is the walk's, node
by node, since on a chain each node has one child.

Shapes: tokens (n,), parents (n,), q (n, V) or None, p (n + 1, V), u (n + 1,) float64 uniforms on p's device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specfamily.core.host import device_inverse_cdf


@dataclass
class WalkResult:
    """A walk's outcome, all tensors on the walk's device: accepted (n,) bool (the path: the accepted nodes in index
    order), next_token () long, zero_q () long: the first tried node whose token has q = 0 (-1: none)."""

    accepted: torch.Tensor
    next_token: torch.Tensor
    zero_q: torch.Tensor


def on(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``tensor`` on ``like``'s device as long: no copy when it is there already, else an asynchronous one (a host
    tensor's bytes are staged at once, so the host waits for nothing)."""
    return (tensor if tensor.device == like.device else tensor.to(like.device, non_blocking=True)).long()


def positions(like: torch.Tensor, n: int) -> torch.Tensor:
    """(n,) long 0 .. n - 1 on ``like``'s device (made from ``like``, so it follows the tensor's own device)."""
    return like.new_ones(n, dtype=torch.long).cumsum(0) - 1


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """() long: the token of probs (V,) whose cumulative interval holds u * total; never one without mass, even where
    a device's parallel cumulative sum rounds a zero's running sum up (:func:`host.device_inverse_cdf`)."""
    return device_inverse_cdf(probs, u).view(())


def normalised(rejected: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """The renormalised residual after a rejection; an all-zero one falls back to the current residual (as the
    host walk's ``_normalise``), with no branch on the device."""
    total = rejected.sum()
    return torch.where(total > 0, rejected / total.clamp_min(torch.finfo(rejected.dtype).tiny),
                       current / current.sum())


def rejected_residual(residual: torch.Tensor, token: torch.Tensor, q_row: torch.Tensor | None) -> torch.Tensor:
    """max(r - q, 0) for a sampled node, r with r(x) = 0 for a deterministic one (q = one-hot(x)); not normalised.
    token: (1,) long."""
    if q_row is None:
        return residual.scatter(0, token, 0.0)
    return torch.clamp(residual - q_row, min=0.0)


def tree_walk(tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
              u: torch.Tensor) -> WalkResult:
    """Recursive rejection sampling over a token tree, on p's device, branch-free (see the module docstring).
    p and q are read in float64."""
    n = tokens.numel()
    p64, q64 = p.double(), None if q is None else q.double()
    tokens = on(tokens, p)
    parent_of = parents.tolist() if parents.device.type == "cpu" else on(parents, p)  # host ints: nothing to move
    current = tokens.new_full((), -1)  # the node the walk stands on (-1: the root)
    residual = p64[0]
    accepted = torch.zeros_like(tokens, dtype=torch.bool)
    zero_q = tokens.new_full((), -1)
    for i in range(n):
        token = tokens[i : i + 1]
        active = current == parent_of[i]
        p_x = residual.gather(0, token)[0]
        q_x = p_x.new_ones(()) if q64 is None else q64[i].gather(0, token)[0]
        refused = active & (q_x <= 0)
        zero_q = torch.where(refused & (zero_q < 0), i, zero_q)
        ok = active & ~refused & (u[i] < torch.clamp(p_x / q_x, max=1.0))
        after = normalised(rejected_residual(residual, token, None if q64 is None else q64[i]), residual)
        residual = torch.where(ok, p64[i + 1], torch.where(active, after, residual))
        current = torch.where(ok, i, current)
        accepted[i] = ok
    return WalkResult(accepted, inverse_cdf(residual, u[n]), zero_q)


def chain_walk(tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, u: torch.Tensor) -> WalkResult:
    """Speculative sampling over a chain in one block: all accept tests at once, the first rejection k, the residual
    of row k (or row n when all are accepted) computed once, the next token drawn from it."""
    n = tokens.numel()
    p64, q64 = p.double(), None if q is None else q.double()
    tokens = on(tokens, p)
    if n == 0:  # plain decoding: the next token from row 0
        return WalkResult(tokens.bool(), inverse_cdf(p64[0], u[0]), tokens.new_full((), -1))
    nodes = positions(tokens, n)
    p_x = p64[nodes, tokens]  # (n,)
    q_x = torch.ones_like(p_x) if q64 is None else q64[nodes, tokens]
    zero = q_x <= 0
    ok = ~zero & (u[:n] < torch.clamp(p_x / q_x, max=1.0))
    prefix = torch.cumprod(ok.long(), dim=0)  # (n,) 1 while every node so far was accepted
    k = prefix.sum()  # accepted count; node k (if k < n) is the first rejected or refused
    tried_zero = zero & torch.cat([prefix.new_ones(1), prefix[:-1]]).bool()  # tried: every node before accepted
    zero_q = torch.where(tried_zero.any(), tried_zero.long().argmax(), -1)
    row = p64.index_select(0, k.view(1))[0]  # (V,) the row the walk ends on
    at = k.clamp(max=n - 1).view(1)
    rejected = rejected_residual(row, tokens.index_select(0, at), None if q64 is None else q64.index_select(0, at)[0])
    residual = torch.where(k < n, normalised(rejected, row), row)
    return WalkResult(nodes < k, inverse_cdf(residual, u[n]), zero_q)
