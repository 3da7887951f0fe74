"""On CUDA: greedy decoding, plain and with every drafter, against transformers' greedy ``generate`` on tiny models.

float32: token for token. bfloat16: different pass shapes round differently, so the text may leave the reference
at near-ties only (``specfamily.testing.greedy``'s criterion: a logit gap within 2 bf16 ulps); any other flip fails.
"""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.target import load_target
from specfamily.recipes.every_drafter import covered, every_drafter
from specfamily.testing import tiny_model
from specfamily.testing.greedy import GreedyCase, check_report, compare_greedy, greedy_prompts, reference_greedy

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

VOCAB, PROMPTS, NEW_TOKENS = 256, 12, 24
DRAFTERS = every_drafter([p.tolist() for p in greedy_prompts(VOCAB, PROMPTS)])
CASES: dict[tuple[str, torch.dtype], GreedyCase] = {}


def cuda_case(family: str, dtype: torch.dtype) -> GreedyCase:
    """A tiny target on the GPU (4 layers, 64 wide) with transformers' greedy references, built once per test run."""
    if (family, dtype) not in CASES:
        model = tiny_model(family, VOCAB, seed=0, dtype=dtype, spread=1.0, hidden=64, layers=4).to("cuda")
        prompts = greedy_prompts(VOCAB, PROMPTS)
        references = [reference_greedy(model, prompt, NEW_TOKENS) for prompt in prompts]
        CASES[family, dtype] = GreedyCase(family, load_target(model), prompts, references, NEW_TOKENS)
    return CASES[family, dtype]


def test_every_registered_drafter_is_covered():
    assert not covered(DRAFTERS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_matches_transformers_on_cuda(name, family, dtype):
    case = cuda_case(family, dtype)
    assert case.target.device.type == "cuda"
    report = compare_greedy(case, DRAFTERS[name](case.target))
    print(f"\n{name} {family}: {report.describe()}")
    assert report.prompts == PROMPTS and report.tokens >= PROMPTS
    check_report(report)  # float32: no flip at all; bf16: flips at near-ties only


@pytest.mark.parametrize("name", DRAFTERS)
def test_every_request_in_a_batch_gets_transformers_greedy_text_on_cuda(name):
    """``generate_batch`` on the GPU, float32: 12 requests of 3-38 tokens at max_batch 4 (ragged caches and drafts,
    continuous batching), each drafter as DRAFTERS builds it (a constant draft length, so it drafts every pass it
    can: on the CPU with this model every one proposed 46-3072 tokens); every request's text is transformers'."""
    case = cuda_case("llama", torch.float32)
    assert case.target.device.type == "cuda"
    results = sf.generate_batch(case.target, DRAFTERS[name](case.target), case.prompts, NEW_TOKENS, max_batch=4)
    assert [r.tokens for r in results] == [reference for reference, _ in case.references]
    assert (sum(r.metrics.proposed_tokens for r in results) > 0) == (name != "plain")  # the drafts were verified
