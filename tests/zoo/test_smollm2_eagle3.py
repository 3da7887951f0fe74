"""eagle3 on the real target zoo:smollm2 (slow): greedy identity against transformers' own ``generate`` on
Spec-Bench first turns (chat template), chain and tree, at a constant draft length so every pass drafts.

Two kinds of drafter (feature layers the reference's default 2, 15, 27 of 30): the shipped, self-distilled
``zoo:smollm2-eagle3`` (16384-token draft vocabulary, d2t), whose drafts are often accepted, so the accepted paths
(partial acceptance, cache rollback, the bonus token) run on the real target; and seeded random ones, whose drafts
are nearly always rejected (the full-vocabulary head and a reduced draft vocabulary with gaps). The shipped one at
its defaults is in tests/zoo/test_smollm2.py.
"""

from __future__ import annotations

import pytest
import torch
from eval_helpers import greedy_reference, spec_bench_first_turns

import specfamily as sf

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 48
REDUCED = list(range(0, 49152, 3))  # 16384 target ids: a draft vocabulary with gaps, mapped through d2t
DRAFTERS = {
    "chain gamma=3": {"mode": "chain", "gamma": 3},
    "tree gamma=4": {"mode": "tree", "gamma": 4},
    "tree reduced-vocabulary gamma=3": {"mode": "tree", "gamma": 3, "top_k": 3, "total_tokens": 10,
                                        "draft_vocab": REDUCED},
    "chain reduced-vocabulary gamma=4": {"mode": "chain", "gamma": 4, "draft_vocab": REDUCED},
}


@pytest.fixture(scope="module")
def target():
    threads = torch.get_num_threads()
    yield sf.load_target("zoo:smollm2")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def prompts(target) -> list[list[int]]:
    return spec_bench_first_turns(target.tokenizer)


@pytest.fixture(scope="module")
def reference(target, prompts) -> list[list[int]]:
    return greedy_reference(target.model, prompts, MAX_NEW_TOKENS)


SHIPPED = {"shipped chain gamma=3": {"mode": "chain", "gamma": 3}, "shipped tree gamma=3": {"mode": "tree", "gamma": 3}}


def _decode_all(target, drafter, prompts, reference, label: str) -> tuple[list[float], int]:
    """Decode every prompt; assert transformers' tokens; (drafted share per prompt, accepted draft tokens)."""
    shares, accepted = [], 0
    for ids, expected in zip(prompts, reference, strict=True):
        result = sf.generate(target, drafter, ids, MAX_NEW_TOKENS)
        assert result.tokens == expected, f"eagle3 {label} differs on a {len(ids)}-token prompt"
        assert result.metrics.proposed_tokens > 0
        shares.append(result.metrics.drafted_share)
        accepted += result.metrics.accepted_tokens
    print(label, "drafted share per prompt", shares, "accepted", accepted)
    assert len(prompts) >= 10 and min(shares) >= 0.9  # a draft verified on (nearly) every pass after the prefill
    return shares, accepted


@pytest.mark.parametrize("label", SHIPPED)
def test_the_shipped_eagle3_greedy_output_equals_generate_with_drafts_accepted(target, prompts, reference, label):
    drafter = sf.create_drafter("eagle3", target, **SHIPPED[label])  # weights: the zoo's zoo:smollm2-eagle3
    assert drafter.needs_features == (2, 15, 27) and drafter.model.vocab.size == 16384
    _, accepted = _decode_all(target, drafter, prompts, reference, label)
    assert accepted > 0


@pytest.mark.parametrize("label", DRAFTERS)
def test_seeded_eagle3_greedy_output_equals_generate_on_spec_bench(target, prompts, reference, label):
    drafter = sf.create_drafter("eagle3", target, weights="random", seed=7, **DRAFTERS[label])
    assert drafter.needs_features == (2, 15, 27)  # the reference's low, middle and high layers of 30
    _decode_all(target, drafter, prompts, reference, label)
