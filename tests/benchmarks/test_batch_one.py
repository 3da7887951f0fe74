"""batch_one's plumbing on a tiny target: both paths decode each request's greedy text (no timing claims)."""

from __future__ import annotations

import time

import pytest

from specfamily.testing import tiny_target


@pytest.fixture
def one_module(benchmark_module):
    return benchmark_module("batch_one")


@pytest.mark.parametrize("name", ["plain", "prompt_lookup"])
def test_both_paths_decode_the_same_tokens(one_module, name):
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    prompts = [[1, 2, 3, 1, 2, 3], [6, 7, 6, 7]]
    seconds, one, _ = one_module.run(target, name, "generate", prompts, 6, time.process_time)
    _, batch, _ = one_module.run(target, name, "generate_batch", prompts, 6, time.process_time)
    assert seconds >= 0 and [len(t) for t in one] == [6, 6]
    assert one == batch


def test_a_constant_gamma_makes_both_paths_draft_alike(one_module):
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [6, 7, 6, 7, 6, 7]]
    _, one, passes = one_module.run(target, "prompt_lookup", "generate", prompts, 8, time.process_time, gamma=3)
    _, batch, again = one_module.run(target, "prompt_lookup", "generate_batch", prompts, 8, time.process_time, gamma=3)
    assert one == batch and passes == again
    assert sum(passes) < 2 * 9  # it drafted: fewer passes than the prefill and one a token
