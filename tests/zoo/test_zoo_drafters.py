"""Every shipped drafter on the shipped zoo target: greedy output identical to plain decoding, token for token,
on the zoo's held-out prompts (a spread of them here; every prompt of both sets under ``-m slow``).

Each arm is built with its shipped defaults (weights, trees, skip set) and driven at a constant draft length (its
own ``gamma``, else the kit's GAMMA): the cost-aware policy may draft nothing, and a check that drafts nothing
compares plain decoding with itself. Every arm asserts that it drafted and that drafts were verified."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.testing.depth import DepthRecorder
from specfamily.testing.greedy import GAMMA
from specfamily.zoo.prompts import prompt_ids

DRAFTERS = {
    "small_model": {"model": "zoo:code-draft"},
    "small_model confidence": {"model": "zoo:code-draft", "gamma": 8, "confidence": 0.4},
    "prompt_lookup": {},
    "prompt_lookup tree": {"branches": 3},
    "self_spec": {},
    "medusa": {},
    "medusa chain": {"tree": "chain"},
    "eagle": {},
    "eagle chain": {"mode": "chain"},
}
PROMPT_TOKENS = 256  # the end of each prompt: keeps the test quick, still far past any draft length


@pytest.fixture(scope="module")
def target():
    """The zoo target, with torch capped at 2 threads while this module runs (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    yield sf.load_target("zoo:code-target", device="cpu")
    torch.set_num_threads(threads)


def _prompts(target, name: str, count: int | None) -> list[list[int]]:
    return prompt_ids(name, count, target.tokenizer, last=PROMPT_TOKENS)


@pytest.fixture(scope="module")
def plain_outputs(target):
    """Plain greedy decoding of each prompt, computed once per (prompts, length) for every drafter."""
    cache: dict[tuple, list[int]] = {}

    def outputs(prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in cache:
            cache[key] = sf.generate(target, None, prompt, max_new_tokens=max_new_tokens).tokens
        return cache[key]

    return outputs


def _check(target, plain_outputs, label: str, prompts: list[list[int]], max_new_tokens: int) -> None:
    name, options = label.split()[0], DRAFTERS[label]
    drafter = DepthRecorder(sf.create_drafter(name, target, **options), gamma=options.get("gamma", GAMMA))
    proposed = 0
    for i, prompt in enumerate(prompts):
        ours = sf.generate(target, drafter, prompt, max_new_tokens=max_new_tokens)
        assert ours.tokens == plain_outputs(prompt, max_new_tokens), (
            f"{label}, prompt {i}: greedy output differs from plain decoding")
        assert not ours.lossy
        proposed += ours.metrics.proposed_tokens
    assert proposed > 0 and drafter.stats.passes > 0, f"{label} drafted nothing: {drafter.stats.summary()}"
    assert drafter.stats.deepest_accepted >= 1, f"{label} never had a draft token accepted: {drafter.stats.summary()}"


def test_plain_decoding_equals_transformers_on_held_out_prompts(target):
    for prompt in _prompts(target, "complete", 3):
        ids = torch.tensor([prompt])
        reference = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                          max_new_tokens=32, pad_token_id=0)[0, len(prompt):].tolist()
        assert sf.generate(target, None, prompt, max_new_tokens=32).tokens == reference


@pytest.mark.parametrize("label", DRAFTERS)
def test_greedy_output_equals_plain_decoding(target, plain_outputs, label):
    _check(target, plain_outputs, label, _prompts(target, "continue", 3) + _prompts(target, "complete", 3), 40)


@pytest.mark.slow
@pytest.mark.parametrize("label", DRAFTERS)
def test_greedy_output_equals_plain_decoding_on_every_held_out_prompt(target, plain_outputs, label):
    _check(target, plain_outputs, label, _prompts(target, "continue", None) + _prompts(target, "complete", None), 32)
