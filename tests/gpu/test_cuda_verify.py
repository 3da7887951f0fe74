"""On CUDA: the device walk (verify_tree with the GPU's generator) keeps the law, gives the CPU walk's result for the
same uniforms, and synchronises with the host once per pass (torch.cuda's sync debug mode counts the synchronising
calls). tests/core/test_device_verify.py runs the same code on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import device_verify_tree, verify_tree
from specfamily.testing.cuda_syncs import debug_mode_syncs
from specfamily.testing.power import DEFAULT_SIGNIFICANCE
from specfamily.testing.stats import chi_square

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
Q = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)


def _case(gen: torch.Generator, chain: bool, sampled: bool, vocab: int = 50):
    n = int(torch.randint(1, 12, (1,), generator=gen))
    parents = torch.arange(n) - 1 if chain else torch.tensor(
        [int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)])
    p = torch.softmax(2 * torch.randn(n + 1, vocab, generator=gen, dtype=torch.float64), dim=-1)
    q = torch.softmax(2 * torch.randn(n, vocab, generator=gen, dtype=torch.float64), dim=-1)
    tokens = torch.multinomial(q if sampled else p[parents + 1], 1, generator=gen).view(-1)
    return tokens, parents, q if sampled else None, p


def _cuda(tensor):
    return None if tensor is None else tensor.cuda()


class Syncs(int):
    """A count of synchronising calls that shows, when an assertion prints it, where each one was made."""

    where: list[str]

    def __repr__(self) -> str:
        return f"{int(self)} synchronising call(s), at {self.where}"


def _syncs(fn) -> tuple[object, Syncs]:
    """fn()'s result and how many synchronising CUDA calls it made (with the file:line of each), by torch.cuda's
    sync debug mode (not counting the notice its first switch in a process warns: session 15 counted it, 2 a pass)."""
    result, where = debug_mode_syncs(fn)
    count = Syncs(len(where))
    count.where = where
    return result, count


@pytest.mark.parametrize("chain", [False, True], ids=["tree", "chain"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_same_result_as_on_the_cpu_for_the_same_uniforms(chain, sampled):
    cases, depths = torch.Generator().manual_seed(3 + 2 * chain + sampled), []
    for _ in range(200):
        tokens, parents, q, p = _case(cases, chain, sampled)
        u = torch.rand(tokens.numel() + 1, generator=cases, dtype=torch.float64)
        on_cpu = device_verify_tree(tokens, parents, q, p, u)
        assert device_verify_tree(tokens.cuda(), parents, _cuda(q), p.cuda(), u.cuda()) == on_cpu
        depths.append(len(on_cpu[0]))
    assert max(depths) >= 2


@pytest.mark.parametrize("chain", [False, True], ids=["tree", "chain"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_one_synchronisation_per_pass(chain, sampled):
    """Everything on the GPU but parents (a host tensor, as drafters give it): one synchronising call a pass; the
    counter has power: the host walk on the same tensors makes more."""
    cases, gen = torch.Generator().manual_seed(9), torch.Generator(device="cuda").manual_seed(0)
    for _ in range(20):
        tokens, parents, q, p = _case(cases, chain, sampled)
        tokens, q, p = tokens.cuda(), _cuda(q), p.cuda()
        verify_tree(tokens, parents, q, p, gen)  # warm-up: kernels loaded, allocator primed
        (path, token), syncs = _syncs(lambda: verify_tree(tokens, parents, q, p, gen))  # noqa: B023
        assert syncs == 1, syncs
        assert all(0 <= node < tokens.numel() for node in path) and 0 <= token < p.shape[1]
    _, host_syncs = _syncs(lambda: verify_tree(tokens, parents, q, p, gen, device_walk=False))
    assert host_syncs >= 1


def test_verify_draft_on_cuda_logits_synchronises_once():
    """The loop's rule on CUDA logits and generator: the warp of every row and the walk, one synchronisation."""
    sampling, gen = SamplingConfig(0.7, top_p=0.9), torch.Generator(device="cuda").manual_seed(1)
    logits = 3 * torch.randn(5, 49152, device="cuda")
    q = warp(logits[:4] + torch.randn(4, 49152, device="cuda"), sampling)
    tokens = torch.multinomial(q, 1, generator=gen).view(-1)
    for parents in (torch.tensor([-1, 0, 1, 2]), torch.tensor([-1, -1, 0, 1])):
        draft = Draft(tokens=tokens, parents=parents, q=q)
        verify_draft(draft, logits, sampling, gen)
        _, syncs = _syncs(lambda: verify_draft(draft, logits, sampling, gen))  # noqa: B023
        assert syncs == 1, syncs


@pytest.mark.parametrize("parents", [[-1], [-1, -1]], ids=["chain", "tree"])
def test_textbook_law_on_the_gpus_generator(parents):
    gen, drafts, n = torch.Generator(device="cuda").manual_seed(0), torch.Generator().manual_seed(1), 20000
    parents = torch.tensor(parents)
    q = Q.expand(len(parents), 5).contiguous()
    p_rows, q_rows = torch.stack([P] * (len(parents) + 1)).cuda(), q.cuda()
    counts, accepted = torch.zeros(5), 0
    for _ in range(n):
        x = torch.multinomial(q, 1, replacement=True, generator=drafts).view(-1)
        path, nxt = verify_tree(x.cuda(), parents, q_rows, p_rows, gen)
        counts[int(x[path[0]]) if path else nxt] += 1
        accepted += bool(path)
    _, p_value, _ = chi_square(counts.double(), P)
    assert p_value >= DEFAULT_SIGNIFICANCE
    if len(parents) == 1:
        assert accepted / n == pytest.approx(0.67, abs=0.015)
