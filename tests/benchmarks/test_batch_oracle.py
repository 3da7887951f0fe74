"""batch_oracle's cut on a tiny target: a draft cut to what the target accepts (no timing claims)."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.types import Draft
from specfamily.testing import tiny_target


@pytest.fixture
def oracle_module(benchmark_module):
    return benchmark_module("batch_oracle")


def test_the_accepted_part_of_a_chain_and_of_a_tree(oracle_module):
    chain = Draft.chain([5, 6, 7, 8])
    assert oracle_module.accepted_part(chain, [5, 6, 9, 8]).tokens.tolist() == [5, 6]
    assert oracle_module.accepted_part(chain, [4, 6, 7, 8]).tokens.tolist() == []
    assert oracle_module.accepted_part(chain, [5, 6]).tokens.tolist() == [5, 6]  # no further than the text
    tree = Draft(torch.tensor([5, 4, 6, 7, 9]), torch.tensor([-1, -1, 0, 0, 3]))  # 5 -> {6, 7 -> 9}, and 4
    part = oracle_module.accepted_part(tree, [5, 7, 9, 1])
    assert part.tokens.tolist() == [5, 7, 9] and part.parents.tolist() == [-1, 0, 1]
    assert oracle_module.accepted_part(tree, [4, 4]).tokens.tolist() == [4]


def test_an_oracle_drafter_feeds_only_what_the_target_accepts_in_a_batch(oracle_module):
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [6, 7, 6, 7, 6, 7], [3, 4, 5, 3, 4, 5, 3]]
    plain = sf.generate_batch(target, None, prompts, 12, max_batch=2)
    texts = {tuple(p): p + r.tokens for p, r in zip(prompts, plain, strict=True)}
    drafter = oracle_module.oracle(sf.create_drafter("prompt_lookup", target, gamma=3), texts)
    results = sf.generate_batch(target, drafter, prompts, 12, max_batch=2)
    assert [r.tokens for r in results] == [r.tokens for r in plain]
    proposed = sum(r.metrics.proposed_tokens for r in results)
    assert proposed > 0 and sum(r.metrics.accepted_tokens for r in results) == proposed
    unchecked = sf.generate_batch(target, sf.create_drafter("prompt_lookup", target, gamma=3), prompts, 12,
                                  max_batch=2)  # the same drafter uncut proposes tokens the target rejects
    assert sum(r.metrics.accepted_tokens for r in unchecked) < sum(r.metrics.proposed_tokens for r in unchecked)
