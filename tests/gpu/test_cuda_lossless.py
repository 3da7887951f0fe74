"""On CUDA: the verifier and whole generations follow the target's exact law.

The verifier on CUDA tensors with a CPU generator gives exactly the CPU result; with the GPU's own generator it
draws its uniforms as one block per pass, so only the law can be compared: the textbook example, and the
conformance suite's chi-square tests (marginals, pairs, joint) of generations with drafters at full depth, on a
tiny float64 target on the GPU: every registered drafter in each of its modes (the cases of
tests/testing/test_registered_drafters.py) under the three sampling settings of the suite.
"""

from __future__ import annotations

import pytest
import torch
from test_registered_drafters import CASES, DEPTH, SAMPLING_IDS, Case

import specfamily as sf
from specfamily.core.target import load_target
from specfamily.core.verify import verify_chain, verify_tree
from specfamily.testing import SAMPLING_MATRIX, draft_model_for, tiny_model
from specfamily.testing.conformance import N_TOKENS, PROMPT, exact_distribution, sample_sequences
from specfamily.testing.power import DEFAULT_SIGNIFICANCE, run_samples
from specfamily.testing.stats import impossible_samples, sequence_tests

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
Q = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)


def _random_tree(gen: torch.Generator, vocab: int = 50):
    n = int(torch.randint(1, 12, (1,), generator=gen))
    parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)])
    p = torch.softmax(3 * torch.randn(n + 1, vocab, generator=gen), dim=-1)
    q = torch.softmax(3 * torch.randn(n, vocab, generator=gen), dim=-1)
    return torch.multinomial(q, 1, generator=gen).view(-1), parents, q, p


def test_cuda_tensors_with_a_cpu_generator_give_the_cpu_result():
    cases = torch.Generator().manual_seed(0)
    for seed in range(300):
        tokens, parents, q, p = _random_tree(cases)
        q = None if seed % 3 == 0 else q
        on_cpu = verify_tree(tokens, parents, q, p, torch.Generator().manual_seed(seed))
        cuda_q = None if q is None else q.cuda()
        on_gpu = verify_tree(tokens.cuda(), parents, cuda_q, p.cuda(), torch.Generator().manual_seed(seed))
        assert on_gpu == on_cpu


def test_cuda_generator_keeps_the_textbook_law():
    gen = torch.Generator(device="cuda").manual_seed(0)
    drafts = torch.Generator().manual_seed(1)
    p_rows, q_row = torch.stack([P, P]).cuda(), Q.view(1, -1).cuda()
    n, counts, accepted = 20000, torch.zeros(5), 0
    for _ in range(n):
        x = torch.multinomial(Q, 1, generator=drafts)
        k, nxt = verify_chain(x.cuda(), q_row, p_rows, gen)
        counts[int(x) if k == 1 else nxt] += 1
        accepted += k
    assert accepted / n == pytest.approx(0.67, abs=0.015)
    assert torch.allclose(counts / n, P.float(), atol=0.015)


def test_cuda_generator_keeps_a_deterministic_trees_law():
    gen = torch.Generator(device="cuda").manual_seed(2)
    tokens, parents, p = torch.tensor([1, 0]), torch.tensor([-1, -1]), torch.stack([P, P, P]).cuda()
    counts, n = torch.zeros(5), 20000
    for _ in range(n):
        path, nxt = verify_tree(tokens, parents, None, p, gen)
        counts[int(tokens[path[0]]) if path else nxt] += 1
    assert torch.allclose(counts / n, P.float(), atol=0.015)


def _drafter(case: Case | None, target):
    """The case's drafter on the CUDA target (the small model moved to the GPU too); None for plain decoding."""
    if case is None:
        return None
    if case.name == "small_model":
        return sf.create_drafter("small_model", target, **case.options, model=draft_model_for(target).to(target.device))
    return case.factory(target)


def _matrix() -> list:
    """Every registered drafter's case (chain and tree modes) and plain decoding under each of the three sampling
    settings. A rotation (case i with setting i mod 3) runs by default, which gives every drafter, mode and setting;
    the rest of the cross product is marked slow (benchmarks/gpu_check.sh runs ``-m "cuda and not slow"``, the
    rotation; ``pytest -m cuda tests/gpu`` runs all of it)."""
    params = []
    for i, case in enumerate([None, *CASES]):
        for j, (sampling, label) in enumerate(zip(SAMPLING_MATRIX, SAMPLING_IDS, strict=True)):
            marks = () if j == i % len(SAMPLING_MATRIX) else (pytest.mark.slow,)
            params.append(pytest.param(case, sampling, id=f"{case or 'plain'}-{label}", marks=marks))
    return params


@pytest.mark.parametrize("case, sampling", _matrix())
def test_generations_on_cuda_follow_the_exact_law(case, sampling):
    """The conformance suite's tests on a CUDA target (its generator, warping and verifier on the GPU), each
    drafter driven at depth 3 and asserted to have verified that deep, in the mode (chain or tree) of its case."""
    target = load_target(tiny_model("llama", 8, seed=0, dtype=torch.float64), device="cuda")
    prompt, vocab = (PROMPT if case is None else case.prompt()), target.vocab_size
    samples = run_samples(vocab, N_TOKENS)
    joint = exact_distribution(target, prompt, N_TOKENS, sampling)
    sequences, depth = sample_sequences(target, _drafter(case, target), prompt, N_TOKENS, sampling, samples,
                                        gamma=DEPTH)
    tests = sequence_tests(sequences, joint, vocab)
    worst = min(tests, key=lambda test: test.p_value)
    adjusted = min(1.0, len(tests) * worst.p_value)
    print(f"\n{case or 'plain'} {sampling}: {samples} samples, worst {worst.name} p {worst.p_value:.2e} "
          f"(adjusted {adjusted:.2e})" + ("" if depth is None else f"; {depth.summary()}"))
    assert impossible_samples(sequences, joint, vocab) == 0
    assert adjusted >= DEFAULT_SIGNIFICANCE
    if depth is not None:
        assert depth.deepest_verified == depth.deepest_drafted == DEPTH, depth.summary()
        assert (depth.trees > 0) == (case.mode == "tree"), depth.summary()
