"""On CUDA: the verifier and whole generations follow the target's exact law.

The verifier on CUDA tensors with a CPU generator gives exactly the CPU result; with the GPU's own generator it
draws its uniforms as one block per pass, so only the law can be compared: the textbook example, and the
conformance suite's chi-square tests (marginals, pairs, joint) of generations with drafters at full depth, on a
tiny float64 target on the GPU.
"""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.target import load_target
from specfamily.core.types import SamplingConfig
from specfamily.core.verify import verify_chain, verify_tree
from specfamily.testing import draft_model_for, tiny_model
from specfamily.testing.conformance import N_TOKENS, PROMPT, exact_distribution, sample_sequences
from specfamily.testing.power import DEFAULT_SIGNIFICANCE, run_samples
from specfamily.testing.stats import impossible_samples, sequence_tests

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
Q = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)
DEPTH = 3


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


FACTORIES = {
    "plain": lambda t: None,
    "small_model": lambda t: sf.create_drafter("small_model", t, model=draft_model_for(t).to(t.device), gamma=DEPTH),
    "eagle_tree": lambda t: sf.create_drafter("eagle", t, weights="random", gamma=DEPTH, top_k=4, total_tokens=30),
    "medusa_tree": lambda t: sf.create_drafter("medusa", t, weights="random", gamma=DEPTH,
                                               tree=[(a,) for a in range(8)] + [(a, b) for a in range(8)
                                                                                for b in range(4)]
                                               + [(a, b, c) for a in range(8) for b in range(4) for c in range(2)]),
}
CONFIGS = {"plain": SamplingConfig(temperature=1.0), "small_model": SamplingConfig(temperature=1.0),
           "eagle_tree": SamplingConfig(temperature=0.7, top_p=0.9), "medusa_tree": SamplingConfig(temperature=1.0,
                                                                                                  top_k=5)}


@pytest.mark.parametrize("name", FACTORIES)
def test_generations_on_cuda_follow_the_exact_law(name):
    """The conformance suite's tests on a CUDA target (its generator, warping and verifier on the GPU)."""
    target = load_target(tiny_model("llama", 8, seed=0, dtype=torch.float64), device="cuda")
    sampling, vocab = CONFIGS[name], target.vocab_size
    samples = run_samples(vocab, N_TOKENS)
    joint = exact_distribution(target, PROMPT, N_TOKENS, sampling)
    sequences, depth = sample_sequences(target, FACTORIES[name](target), PROMPT, N_TOKENS, sampling, samples)
    tests = sequence_tests(sequences, joint, vocab)
    worst = min(tests, key=lambda test: test.p_value)
    adjusted = min(1.0, len(tests) * worst.p_value)
    print(f"\n{name} {sampling}: {samples} samples, worst {worst.name} p {worst.p_value:.2e} (adjusted {adjusted:.2e})"
          + ("" if depth is None else f"; {depth.summary()}"))
    assert impossible_samples(sequences, joint, vocab) == 0
    assert adjusted >= DEFAULT_SIGNIFICANCE
    if depth is not None:
        assert depth.deepest_verified == DEPTH, depth.summary()
