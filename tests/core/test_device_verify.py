"""The device walk (specfamily.core.device_verify, verify_tree's accelerator path) on CPU tensors.

Exact: given the same uniforms (node i's try reads u[i], the final token u[n]) the device walk returns what the host
walk returns, tree and chain, sampled and deterministic, on many random cases, so it inherits the host walk's law
(which the conformance kit tests). Law: the textbook chain and a deterministic tree by chi-square, with the walk's
own block of uniforms. Cost: one host synchronisation per pass, counted on stand-in device tensors (DeviceTensor,
which sees Python-level reads, and specfamily.testing.syncs, which sees every aten op and host<->device copy).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_host import DeviceTensor, _old_verify_tree, _on_device, _random_case

import specfamily.core.verify as verify
from specfamily.core import host
from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import DraftProbabilityError, device_verify_tree, verify_tree
from specfamily.testing.power import DEFAULT_SIGNIFICANCE
from specfamily.testing.stats import chi_square
from specfamily.testing.syncs import SyncCounter, on_device

P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
Q = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)


class NodeDraws:
    """The host walk's draws with the device walk's assignment: the try of node i reads u[i], the final token u[n]."""

    def __init__(self, u: list[float]) -> None:
        self.u, self.node, self.tried = u, None, []

    def uniform(self) -> float:
        self.tried.append(self.node)
        return self.u[self.node]

    def sample(self, probs: torch.Tensor) -> int:
        return host.inverse_cdf(probs, self.u[-1])


def _host_walk(monkeypatch, tokens, parents, q, p, u) -> tuple[tuple[list[int], int], list[int]]:
    """The host walk's result with uniforms assigned per node, and the nodes it tried."""
    real = verify._try_child

    def tagged(residual, token, q_row, draws, node=0):
        draws.node = node
        return real(residual, token, q_row, draws, node)

    monkeypatch.setattr(verify, "_try_child", tagged)
    draws = NodeDraws(u.tolist())
    result = verify._host_walk(tokens, parents, q, lambda i: p[i].double(), draws)
    monkeypatch.setattr(verify, "_try_child", real)
    return result, draws.tried


@pytest.mark.parametrize("shape", ["tree", "chain"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_same_result_as_the_host_walk_given_the_same_uniforms(monkeypatch, shape, sampled):
    cases = torch.Generator().manual_seed(31 + sampled)
    depths, tried_late = [], 0
    for _ in range(300):
        tokens, parents, q, p = _random_case(cases, sampled, dtype=torch.float64)
        if shape == "chain":
            parents = torch.arange(tokens.numel()) - 1
        if sampled and bool((q[torch.arange(tokens.numel()), tokens] == 0).any()):
            continue  # a token its q cannot have drawn (float rounding): the refusal has its own test
        u = torch.rand(tokens.numel() + 1, generator=cases, dtype=torch.float64)
        (path, token), tried = _host_walk(monkeypatch, tokens, parents, q, p, u)
        assert device_verify_tree(tokens, parents, q, p, u) == (path, token)
        assert tried == sorted(tried)  # tries come in node order: what the device walk's one sweep assumes
        depths.append(len(path))
        tried_late += bool(tried) and len(tried) > len(path) + 1  # a rejected sibling before the last try
    assert max(depths) >= 3
    assert shape == "chain" or tried_late > 10  # the trees exercised residuals after rejected siblings


def test_plain_decoding_n_0():
    p = torch.stack([P])
    for u, expected in ((0.0, 0), (0.41, 0), (0.43, 1), (0.99, 4)):
        assert device_verify_tree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), None, p,
                                  torch.tensor([u], dtype=torch.float64)) == ([], expected)


@pytest.mark.parametrize("parents", [[-1], [-1, -1]], ids=["chain", "tree"])
def test_textbook_law_with_the_walks_own_uniforms(parents):
    """x ~ q at the root (and, for the tree, an independent second sibling); the first token must follow p (a
    chi-square check beside the exact equality above: 5000 passes, as each costs ~2 ms of small tensor ops)."""
    gen, n = torch.Generator().manual_seed(5), 5000
    parents = torch.tensor(parents)
    counts, accepted = torch.zeros(5), 0
    q, p = Q.expand(len(parents), 5).contiguous(), torch.stack([P] * (len(parents) + 1))
    for _ in range(n):
        x = torch.multinomial(q, 1, replacement=True, generator=gen).view(-1)
        path, nxt = verify_tree(x, parents, q, p, gen, device_walk=True)
        counts[int(x[path[0]]) if path else nxt] += 1
        accepted += bool(path)
    _, p_value, _ = chi_square(counts.double(), P)
    assert p_value >= DEFAULT_SIGNIFICANCE
    if len(parents) == 1:
        assert accepted / n == pytest.approx(0.67, abs=0.02)  # 3 standard deviations at n = 5000


def test_deterministic_trees_law_with_the_walks_own_uniforms():
    gen, n = torch.Generator().manual_seed(6), 5000
    tokens, parents, p = torch.tensor([1, 0]), torch.tensor([-1, -1]), torch.stack([P, P, P])
    counts = torch.zeros(5)
    for _ in range(n):
        path, nxt = verify_tree(tokens, parents, None, p, gen, device_walk=True)
        counts[int(tokens[path[0]]) if path else nxt] += 1
    _, p_value, _ = chi_square(counts.double(), P)
    assert p_value >= DEFAULT_SIGNIFICANCE


def test_an_accelerators_generator_walks_on_the_device(monkeypatch):
    """verify_tree's default: uniforms from an accelerator mean the device walk (here its draws are faked)."""
    walked = []
    monkeypatch.setattr(host, "draw_device", lambda p, generator: torch.device("cuda", 0))
    monkeypatch.setattr(host, "uniform_block", lambda size, generator, device: torch.full((size,), 0.5).double())
    monkeypatch.setattr(verify, "device_verify_tree", lambda *args: walked.append(args) or ([], 0))
    verify_tree(torch.tensor([1]), torch.tensor([-1]), None, torch.stack([P, P]))
    assert len(walked) == 1 and walked[0][-1].tolist() == [0.5, 0.5]


@pytest.mark.parametrize("shape", ["tree", "tree-host-parents", "chain"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_one_host_synchronisation_per_pass(shape, sampled):
    """Tokens, q, p and u on the 'device'; parents there (trees) or on the host (a chain is recognised there)."""
    cases = torch.Generator().manual_seed(8)
    for _ in range(40):
        tokens, parents, q, p = _random_case(cases, sampled, dtype=torch.float64)
        parents = torch.arange(tokens.numel()) - 1 if shape == "chain" else parents
        parents = _on_device(parents) if shape == "tree" else parents
        if sampled and bool((q[torch.arange(tokens.numel()), tokens] == 0).any()):
            continue
        u = torch.rand(tokens.numel() + 1, generator=cases, dtype=torch.float64)
        expected = device_verify_tree(tokens, parents, q, p, u)
        DeviceTensor.transfers = []
        got = device_verify_tree(_on_device(tokens), parents, _on_device(q), _on_device(p), _on_device(u))
        assert DeviceTensor.transfers == ["tolist"], DeviceTensor.transfers
        assert got == expected


@pytest.mark.parametrize("parents, u0", [([-1, 0], 0.0), ([-1, -1], 0.99)], ids=["chain", "tree"])
def test_a_tried_token_with_q_0_is_refused_with_the_host_walks_message(parents, u0):
    """Node 1's token has q = 0. Chain: node 0 accepted (u0 = 0), so node 1 is tried; tree: node 0 rejected
    (u0 = 0.99 >= p/q = 0.3), so its sibling node 1 is tried. Not tried, it is not refused (as on the host)."""
    q = torch.stack([Q, torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64)])
    tokens, p, parents = torch.tensor([4, 3]), torch.stack([P, P, P]), torch.tensor(parents)
    u = torch.tensor([u0, 0.5, 0.5], dtype=torch.float64)
    with pytest.raises(DraftProbabilityError, match=r"^draft token 3 has q = 0 \(node 1\) under the distribution"):
        device_verify_tree(tokens, parents, q, p, u)
    u[0] = 0.99 if u0 == 0.0 else 0.0  # chain: node 0 rejected; tree: node 0 accepted (node 1 is not its child)
    assert device_verify_tree(tokens, parents, q, p, u)[0] == ([] if u0 == 0.0 else [0])


def test_a_q_that_is_not_a_distribution_is_refused_with_check_qs_message():
    q = torch.stack([Q, Q * 2])
    with pytest.raises(DraftProbabilityError, match=r"^q of draft node 1 is not a distribution: a sum of 2"):
        device_verify_tree(torch.tensor([0, 1]), torch.tensor([-1, -1]), q, torch.stack([P, P, P]),
                           torch.full((3,), 0.5, dtype=torch.float64))


def _line_of(module, marker: str) -> str:
    """file:line of the line of ``module``'s source that holds ``marker``."""
    path = Path(module.__file__)
    (number,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line]
    return f"{path}:{number}"


RESULT_COPY = ("copy to host", _line_of(verify, "# the one synchronisation"))


def _device_generator(monkeypatch):
    """Uniforms drawn where p lives, as an accelerator's generator draws them (here the CPU generator draws them on
    the stand-in device, so plain CPU tensors with the same generator give the same uniforms)."""
    monkeypatch.setattr(host, "draw_device", lambda p, generator: p.device)


def _one_hot_case(cases: torch.Generator, sampled: bool):
    """_random_case with p one-hot at each row's argmax (temperature 0 through the walk) and most tokens the argmax
    of their parent's row, so that paths go deep."""
    tokens, parents, q, p = _random_case(cases, sampled, dtype=torch.float64)
    best = p.argmax(dim=-1)
    p = torch.nn.functional.one_hot(best, p.shape[1]).double()
    if q is None:
        tokens = torch.where(torch.rand(tokens.numel(), generator=cases) < 0.7, best[parents + 1], tokens)
    return tokens, parents, q, p


DEEP = {(False, False): 2, (True, False): 3, (False, True): 3, (True, True): 1}  # (sampled, one-hot p): depth reached


@pytest.mark.parametrize("shape", ["tree", "tree-device-parents", "chain"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
@pytest.mark.parametrize("one_hot", [False, True], ids=["p", "greedy-p"])
def test_the_device_walk_synchronises_once_a_pass_at_the_results_copy(monkeypatch, shape, sampled, one_hot):
    """verify_tree on stand-in device tensors with a device generator, every aten op watched: one synchronisation,
    the result's copy, and the CPU tensors' result for the same uniforms; p sampled or one-hot (greedy), q or None."""
    _device_generator(monkeypatch)
    cases, depths, trees = torch.Generator().manual_seed(12 + sampled + 2 * one_hot), [], 0
    for _ in range(40):
        if one_hot:
            tokens, parents, q, p = _one_hot_case(cases, sampled)
        else:
            tokens, parents, q, p = _random_case(cases, sampled, dtype=torch.float64)
        parents = torch.arange(tokens.numel()) - 1 if shape == "chain" else parents
        if sampled and bool((q[torch.arange(tokens.numel()), tokens] == 0).any()):
            continue
        seed = int(torch.randint(1 << 30, (1,), generator=cases))
        expected = verify_tree(tokens, parents, q, p, torch.Generator().manual_seed(seed), device_walk=True)
        on_parents = on_device(parents) if shape == "tree-device-parents" else parents
        gen = torch.Generator().manual_seed(seed)
        with SyncCounter() as syncs:
            got = verify_tree(on_device(tokens), on_parents, on_device(q), on_device(p), gen)
        assert [(s.kind, s.where) for s in syncs.syncs] == [RESULT_COPY], syncs
        assert got == expected
        depths.append(len(got[0]))
        trees += not bool((parents == torch.arange(tokens.numel()) - 1).all())
    assert max(depths) >= DEEP[sampled, one_hot] and (shape == "chain" or trees > 10), depths


@pytest.mark.parametrize("parents", [[-1, 0, 1, 2], [-1, -1, 0, 1]], ids=["chain", "tree"])
@pytest.mark.parametrize("sampling, sampled", [
    (SamplingConfig(0.7, top_p=0.9), True), (SamplingConfig(1.0, top_k=20), True),
    (SamplingConfig(0.7, top_p=0.9), False), (SamplingConfig(0.0), False),
], ids=["t0.7-p0.9", "t1-k20", "t0.7-p0.9-deterministic", "greedy"])
def test_verify_draft_on_device_logits_synchronises_once(monkeypatch, parents, sampling, sampled):
    """The loop's rule on stand-in device logits (V = 4096) and a device generator: the warp of every row on the
    device (no host sync), then the walk; greedy: the argmax and the draft's tokens come back in one wait."""
    _device_generator(monkeypatch)
    gen, vocab, parents = torch.Generator().manual_seed(3), 4096, torch.tensor(parents)
    paths = set()
    for seed in range(6):
        logits = 3 * torch.randn(5, vocab, generator=gen)
        q = warp(logits[:4] + torch.randn(4, vocab, generator=gen), sampling) if sampled else None
        tokens = torch.multinomial(q, 1, generator=gen).view(-1) if sampled else logits[parents + 1].argmax(-1)
        tokens[3] = tokens[3] if sampled else (tokens[3] + 1) % vocab  # greedy: reject the last node
        if sampling.greedy:
            expected = verify_draft(Draft(tokens, parents, q), logits, sampling, torch.Generator().manual_seed(seed))
        else:
            expected = verify_tree(tokens, parents, q, warp(logits, sampling), torch.Generator().manual_seed(seed),
                                   device_walk=True)
        draft = Draft(on_device(tokens), parents, on_device(q))
        with SyncCounter() as syncs:
            got = verify_draft(draft, on_device(logits), sampling, torch.Generator().manual_seed(seed))
        assert syncs.count == 1, syncs
        where = _line_of(host, "non_blocking=k != copies[-1]") if sampling.greedy else RESULT_COPY[1]  # greedy: to_host
        assert (syncs.syncs[0].kind, syncs.syncs[0].where) == ("copy to host", where), syncs
        assert got == expected
        paths.add(len(got[0]))
    assert max(paths) >= (2 if sampling.greedy else 1)


def test_the_counter_has_power_a_walk_that_reads_per_node_is_caught(monkeypatch):
    """The verifier as it was (an .item() per tried node) on the same stand-ins: more than one synchronisation."""
    tokens, parents, q, p = _random_case(torch.Generator().manual_seed(4), True, dtype=torch.float64)
    with SyncCounter() as syncs:
        _old_verify_tree(on_device(tokens), parents, on_device(q), on_device(p), torch.Generator(), draw_on="cpu")
    assert syncs.count >= 2 and {s.kind for s in syncs.syncs} >= {"read", "copy to host"}, syncs


def test_a_cpu_generator_with_device_tensors_costs_a_copy_of_the_uniforms():
    """device_walk=True with a host generator: the uniforms cross to the device with a wait (a real cost the count
    shows: drafters on an accelerator should hand the verifier the device's generator)."""
    tokens, parents, q, p = _random_case(torch.Generator().manual_seed(5), True, dtype=torch.float64)
    with SyncCounter() as syncs:
        verify_tree(on_device(tokens), parents, on_device(q), on_device(p), torch.Generator(), device_walk=True)
    assert [s.kind for s in syncs.syncs] == ["copy to device", "copy to host"], syncs


def test_the_walks_next_token_is_never_a_zero_whose_running_sum_rounds_up(monkeypatch):
    """The device walk draws its next token through host.device_inverse_cdf's guard: a parallel scan that puts a
    zero-mass token's running sum one ulp above its left neighbour's must not make that token drawable (the walk's
    own inversion once searched the raw running sums and drew token 2 here)."""
    from specfamily.core.device_verify import inverse_cdf

    p = torch.tensor([0.25, 0.25, 0.0, 0.5], dtype=torch.float64)
    scanned = torch.tensor([0.25, 0.5, torch.nextafter(torch.tensor(0.5), torch.tensor(1.0)).item(), 1.0],
                           dtype=torch.float64)
    real_cumsum = torch.Tensor.cumsum
    monkeypatch.setattr(torch.Tensor, "cumsum",
                        lambda self, dim: scanned if self.shape == p.shape else real_cumsum(self, dim))
    assert int(torch.searchsorted(p.cumsum(0), torch.tensor([0.5], dtype=torch.float64), right=True)) == 2
    token = inverse_cdf(p, torch.tensor(0.5, dtype=torch.float64))
    assert token.shape == () and int(token) == 3
