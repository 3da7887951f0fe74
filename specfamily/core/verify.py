"""Pure verification math: chains and trees, sampled (q) or deterministic (q = None) proposals.

Recursive rejection sampling: at a node, try its children in order; a sampled child x ~ q is
accepted with probability min(1, p(x) / q(x)), and on rejection p <- norm(max(p - q, 0)); a
deterministic child is the case q = one-hot(x): accepted with probability p(x), and on rejection
p(x) <- 0 and p is renormalised. Accepting descends to the child's own row of p. When no child is
accepted the next token is sampled from what is left of p. Greedy decoding is the same code with
one-hot p. Exact: the committed tokens follow p whatever the drafter proposes.

With a CPU generator (or none, for CPU tensors) the walk runs on the host and branches on every draw
(:mod:`specfamily.core.host`): whatever of tokens, p and q lives on an accelerator is moved to the CPU once per pass
(one copy per device, in the tensors' own dtypes), never an ``.item()`` per node; the uniforms are drawn one per tried
child, the final token by inversion of one more. With an accelerator's generator the walk runs on the device
(:func:`device_verify_tree`, :mod:`specfamily.core.device_verify`): a block of n + 1 uniforms per pass (node i's try
reads u[i], the final token u[n]), chains in one vectorised step, and one host synchronisation for the accepted path
and the next token. The law is the same; the streams differ.

Only the rows the walk reaches are read (the root's, then each accepted node's; q's for each tried child): q's
converted to float64 once, p's read in their own dtype (an accepted try reads one entry; a rejection's residual and the
final draw are computed in float64); :func:`verify_tree_rows` takes p row by row, so that its caller warps no other row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specfamily.core import host
from specfamily.core.device_verify import chain_walk, tree_walk


class DraftProbabilityError(ValueError):
    """A draft's reported q cannot be what its tokens were sampled from: a drafted row that is not a distribution
    (non-finite or negative entries, or a sum off 1 by more than :func:`sum_tolerance`), or a draft token its
    row gives probability 0."""


def sum_tolerance(dtype: torch.dtype) -> float:
    """How far a q row's sum may be from 1: 1e-3, or 4 units in the last place of a coarser dtype (bf16: 0.03)."""
    return max(1e-3, 4 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-3


def check_q(q: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Refuse a q (n, V) any of whose drafted rows is not a distribution, naming the first such node and what is
    wrong with it; ``dtype``: the dtype the drafter reported q in (sets the tolerance on the sum), q's own if None."""
    if q.numel() == 0:
        return
    tolerance = sum_tolerance(q.dtype if dtype is None else dtype)
    if bool(plain_rows(q, tolerance).all()):
        return
    finite, negative, sums, bad = _row_checks(q, tolerance)
    if not bool(bad.any()):
        return
    node = int(bad.nonzero()[0])
    if not finite[node]:
        problem = f"{int((~torch.isfinite(q[node])).sum())} non-finite entries (nan or inf)"
    elif negative[node]:
        problem = f"{int((q[node] < 0).sum())} negative entries (the smallest {float(q[node].min()):.3g})"
    else:
        problem = f"a sum of {float(sums[node]):.6g} (more than {tolerance:.3g} from 1)"
    raise DraftProbabilityError(f"q of draft node {node} is not a distribution: {problem}")


def plain_rows(q: torch.Tensor, tolerance: float) -> torch.Tensor:
    """(n,) bool: rows that are distributions beyond doubt, in two cheap passes (a sum in float32, or in float64
    for float64 q, and a min): the sum within tolerance / 2 of 1 (a NaN or infinite entry makes it fail) and no
    entry below 0. A row that fails it is judged by the exact checks (:func:`_row_checks`), so no verdict changes:
    the float32 sum of a distribution's row is off its float64 sum by far less than tolerance / 2."""
    sums = q.sum(dim=1, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    return ((sums - 1).abs() <= tolerance / 2) & (q.amin(dim=1) >= 0)


def _row_checks(q: torch.Tensor, tolerance: float) -> tuple[torch.Tensor, ...]:
    """(n,) each, on q's device: finite, has a negative entry, the row's sum (float64), not a distribution."""
    finite = torch.isfinite(q).all(dim=1)
    negative = (q < 0).any(dim=1)
    sums = q.sum(dim=1, dtype=torch.float64)
    return finite, negative, sums, ~finite | negative | ((sums - 1).abs() > tolerance)


def _zero_q_error(token: int, node: int) -> DraftProbabilityError:
    return DraftProbabilityError(f"draft token {token} has q = 0 (node {node}) under the distribution it was "
                                 "reported sampled from")


class Rows:
    """The rows of a (m, V) matrix that the walk reads, each computed on its first read (``row(i)``) and kept, with
    no work for the rows of nodes the walk never reaches: q in float64, p in its own dtype (an accepted try reads one
    entry of it, exact as a Python float; a rejection's residual and the final draw are float64)."""

    def __init__(self, row: Callable[[int], torch.Tensor]) -> None:
        self.row, self.read = row, {}

    def __getitem__(self, i: int) -> torch.Tensor:
        if i not in self.read:
            self.read[i] = self.row(i)
        return self.read[i]


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
    return rejected.div_(total)  # rejected is the rejection's own new row: divided in place


def _all_zero_fallback(current: torch.Tensor) -> torch.Tensor:
    """max(r - q, 0) is all zero only when the current residual r is q up to rounding (a rejection then has
    probability ~0): keep sampling from r, which already excludes every rejected sibling, never from the
    node's original p (which would bring rejected tokens back)."""
    current = current.double()
    return current / current.sum()


def _try_child(residual: torch.Tensor, token: int, q_row: torch.Tensor | None, draws,
               node: int = 0) -> tuple[bool, torch.Tensor]:
    """One rejection step of draft node ``node`` against the current residual: (accepted, residual if rejected)."""
    if q_row is None:
        if draws.uniform() < residual[token].item():
            return True, residual
        rejected = residual.to(torch.float64, copy=True)  # p's row is read in its own dtype until a rejection
        rejected[token] = 0.0
        return False, rejected
    q_x = q_row[token].item()
    if q_x <= 0:
        raise _zero_q_error(token, node)
    if draws.uniform() < min(1.0, residual[token].item() / q_x):
        return True, residual
    return False, (residual - q_row).clamp_(min=0.0)


def _walk(children: dict[int, list[int]], tokens: list[int], q64: Rows | None, p64: Rows,
          draws) -> tuple[list[int], int]:
    """Recursive rejection sampling down the tree, on host tensors: p64[i] is row i of p (any float dtype: the
    residuals it makes are float64), q64[i] row i of q in float64."""
    path: list[int] = []
    node, residual = -1, p64[0]
    while True:
        accepted = None
        for child in children.get(node, []):
            ok, rejected = _try_child(residual, tokens[child], None if q64 is None else q64[child], draws, child)
            if ok:
                accepted = child
                break
            residual = _normalise(rejected, residual)
        if accepted is None:
            return path, draws.sample(residual)
        path.append(accepted)
        node, residual = accepted, p64[accepted + 1]


def check_shapes(n: int, p_shape: tuple[int, ...], q: torch.Tensor | None) -> None:
    if len(p_shape) != 2 or p_shape[0] != n + 1:
        raise ValueError(f"p must have shape (n + 1 = {n + 1}, V), got {tuple(p_shape)}")
    if q is not None and q.shape != (n, p_shape[1]):
        raise ValueError(f"q must have shape ({n}, {p_shape[1]}), got {tuple(q.shape)}")


def _host_walk(tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor | None,
               p_row: Callable[[int], torch.Tensor], draws) -> tuple[list[int], int]:
    """The walk over host tensors, p row i read as ``p_row(i)`` (its dtype kept) and q's rows in float64, each when
    first needed."""
    q64 = None
    if q is not None:
        check_q(q)
        q64 = Rows(lambda i: q[i].double())
    return _walk(_children(parents.tolist()), tokens.tolist(), q64, Rows(p_row), draws)


def verify_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
    device_walk: bool | None = None,
) -> tuple[list[int], int]:
    """Accept a path of a token tree against the target's p.

    tokens (n,), parents (n,), q (n, V) or None, p (n+1, V): row 0 at the root, row i+1 after node i.
    Returns (accepted node indices from the root down, the next token sampled by the target).
    ``device_walk``: walk on p's device with one host synchronisation (:func:`device_verify_tree`); None: when the
    uniforms come from an accelerator (the generator's device, or p's for torch's default generator).
    """
    n = tokens.numel()
    check_shapes(n, tuple(p.shape), q)
    device = host.draw_device(p, generator)
    on_device = device.type != "cpu" if device_walk is None else device_walk
    if on_device:
        return device_verify_tree(tokens, parents, q, p, host.uniform_block(n + 1, generator, device))
    block = None if device.type == "cpu" else host.uniform_block(n + 1, generator, device)  # n tries at most, 1 token
    tokens, parents, q, p, block = host.to_host([tokens, parents, q, p, block])
    draws = host.HostDraws(generator) if block is None else host.BlockDraws(block.tolist())
    return _host_walk(tokens, parents, q, lambda i: p[i], draws)


def verify_tree_rows(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    q: torch.Tensor | None,
    p_row: Callable[[int], torch.Tensor],
    p_shape: tuple[int, int],
    generator: torch.Generator | None = None,
) -> tuple[list[int], int]:
    """verify_tree with p given row by row on the host: ``p_row(i)`` (V,) is row i of p (n + 1, V = ``p_shape``),
    asked for only the rows the walk reads (the root's, then each accepted node's), once each.

    For CPU tensors and a CPU generator (or none): the same draws, so the same result, as verify_tree on the
    stacked rows."""
    check_shapes(tokens.numel(), tuple(p_shape), q)
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"verify_tree_rows draws on the host; got a generator on {generator.device}")
    tokens, parents, q = host.to_host([tokens, parents, q])
    return _host_walk(tokens, parents, q, p_row, host.HostDraws(generator))


def device_verify_tree(tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                       u: torch.Tensor) -> tuple[list[int], int]:
    """verify_tree's law with the walk on p's device (:mod:`specfamily.core.device_verify`; a chain in one block when
    parents is a host tensor that says so), uniforms u (n + 1,): node i's try reads u[i], the final token u[n]. The
    accept mask, the next token and what a refused q needs cross to the host in one copy: one synchronisation."""
    return walk_verdict(device_walk(tokens, parents, q, p, u).tolist(), tokens, q)  # the one synchronisation


def device_walk(tokens: torch.Tensor, parents: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                u: torch.Tensor) -> torch.Tensor:
    """:func:`device_verify_tree`'s walk, left on p's device, packed for one copy to the host: (n + 2,) long, or
    (n + 3,) with a q: the accept mask, the next token, the first tried node whose token q gives 0 (-1: none), and
    whether a row of q is not a distribution."""
    n = tokens.numel()
    u = u if u.device == p.device else u.to(p.device)
    chain = parents.device.type == "cpu" and parents.tolist() == list(range(-1, n - 1))
    result = chain_walk(tokens, q, p, u) if chain else tree_walk(tokens, parents, q, p, u)
    flags = [result.next_token.view(1), result.zero_q.view(1)]
    if q is not None:
        flags.append((~plain_rows(q, sum_tolerance(q.dtype))).any().long().view(1))
    return torch.cat([result.accepted.long(), *flags])


def walk_verdict(values: list[int], tokens: torch.Tensor, q: torch.Tensor | None) -> tuple[list[int], int]:
    """A :func:`device_walk`'s packed result read on the host: (accepted nodes, next token), or the error a refused
    q gets (the exact checks name the node and what is wrong with its row)."""
    n = tokens.numel()
    if q is not None and values[n + 2]:
        check_q(q)
    if values[n + 1] >= 0:
        node = values[n + 1]
        raise _zero_q_error(int(tokens[node]), node)
    return [i for i in range(n) if values[i]], values[n]


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
    tokens, parents, target_argmax = host.to_host([tokens, parents, target_argmax])
    return greedy_walk(tokens.tolist(), parents.tolist(), target_argmax.tolist())


def greedy_walk(tokens: Sequence[int], parents: Sequence[int], best: Sequence[int]) -> tuple[list[int], int]:
    """:func:`greedy_tree` on host lists: the draft's tokens and parents, the target's argmax per row (n + 1)."""
    path: list[int] = []
    node = -1
    for child, parent in enumerate(parents):
        # children of a node come after it; the first matching child in index order wins
        if parent == node and tokens[child] == best[node + 1]:
            path.append(child)
            node = child
    return path, best[node + 1]
