"""The batched conformance kit: honest drafters pass inside batches, a drafter that leaks across requests is rejected,
and the registered drafters keep each request's law under batching."""

import importlib
import tempfile

import pytest
import torch

import specfamily as sf
from specfamily.core.types import SamplingConfig
from specfamily.testing import draft_model_for
from specfamily.testing.batched import GAMMAS, PROMPTS, assert_lossless_batched, batched_rogue_gallery
from specfamily.testing.conformance import ConformanceError
from specfamily.testing.rogues import CrossRequestLeak, HonestChain, HonestTree

SAMPLES = 400  # per prompt; the leak below is rejected at p ~ 1e-10 with these


def test_an_honest_chain_passes_inside_batches_at_every_prompts_draft_length():
    fit = assert_lossless_batched(HonestChain, samples=SAMPLES)
    assert fit.passed and fit.batch == 6 and fit.max_batch == 4  # admission while others decode
    assert fit.depths == {tuple(p): g for p, g in zip(PROMPTS, GAMMAS, strict=True)}  # each prompt its own depth


def test_an_honest_tree_passes_inside_batches_under_top_k():
    fit = assert_lossless_batched(HonestTree, sampling=SamplingConfig(1.0, top_k=5), samples=SAMPLES)
    assert fit.passed and fit.depths[tuple(PROMPTS[0])] == 3


def test_a_drafter_that_reads_another_requests_context_is_rejected_only_beside_others():
    rogue = batched_rogue_gallery()[0]
    assert rogue.build is CrossRequestLeak
    alone = assert_lossless_batched(CrossRequestLeak, samples=200, batch=1)  # one request at a time: honest
    assert alone.passed
    with pytest.raises(ConformanceError, match="not lossless under batching: .* batches of 6"):
        assert_lossless_batched(CrossRequestLeak, sampling=rogue.sampling, samples=SAMPLES)


def _registered(name, **options):
    def factory(target):
        if name == "small_model":
            options["model"] = draft_model_for(target)
        if name == "rest":
            options["datastore"] = _rest_datastore(target.vocab_size)
        return sf.create_drafter(name, target, gamma=3, **options)
    return factory


def _rest_datastore(vocab_size: int) -> str:
    """A datastore holding each of the kit's prompts followed by two different continuations (seeded), so REST
    retrieves a tree after every prompt."""
    from specfamily.drafters.rest.datastore import build_datastore

    draws = torch.Generator().manual_seed(5)
    runs = [[*prompt, *torch.randint(0, vocab_size, (4,), generator=draws).tolist()]
            for prompt in PROMPTS for _ in "ab"]
    return str(build_datastore(runs, tempfile.mkdtemp(prefix="rest-batched-"), vocab_size, progress=False))


REGISTERED = [
    pytest.param("small_model", {}, True, id="small_model"),
    pytest.param("eagle", {"weights": "random", "mode": "chain"}, True, id="eagle-chain"),
    pytest.param("self_spec", {"skip": ["mlp:1"]}, True, marks=pytest.mark.slow, id="self_spec"),
    pytest.param("eagle3", {"weights": "random", "top_k": 4, "total_tokens": 30}, False, marks=pytest.mark.slow,
                 id="eagle3-tree"),
    pytest.param("medusa", {"weights": "random"}, False, marks=pytest.mark.slow, id="medusa-tree"),
    pytest.param("prompt_lookup", {}, False, marks=pytest.mark.slow, id="prompt_lookup"),
    pytest.param("suffix", {}, False, marks=pytest.mark.slow, id="suffix"),
    pytest.param("hydra", {"weights": "random"}, False, marks=pytest.mark.slow, id="hydra-tree"),
    pytest.param("lookahead", {}, False, marks=pytest.mark.slow, id="lookahead"),
    pytest.param("recycling", {"template": "2.2.2"}, False, marks=pytest.mark.slow, id="recycling"),
    pytest.param("rest", {}, False, marks=pytest.mark.slow, id="rest"),
    pytest.param("merge", {"parts": ["eagle3", "self_spec"], "options": {
        "eagle3": {"weights": "random", "top_k": 4, "total_tokens": 30, "tree_sampling": "sampled"},
        "self_spec": {"skip": ["mlp:1"]}}}, False, marks=pytest.mark.slow, id="merge-sampled"),
]


# families whose batched proposal runs one draft forward per step for the whole batch: (drafter module, function)
BATCHED_FORWARDS = {
    "small_model": ("specfamily.drafters.small_model.drafter", "propose_small_batch"),
    "eagle": ("specfamily.drafters.eagle.drafter", "propose_feature_batch"),
    "eagle3": ("specfamily.drafters.eagle.drafter", "propose_feature_batch"),
    "self_spec": ("specfamily.drafters.self_spec.drafter", "propose_self_batch"),
}


@pytest.mark.parametrize(("name", "options", "deep"), REGISTERED)
def test_registered_drafters_keep_each_requests_law_under_batching(name, options, deep, monkeypatch):
    """Drafters that report a sampled q are held to each prompt's draft length; copiers and random trees draft what
    their matches and heads allow (their q is None: nothing to misreport at depth). The families with batched draft
    forwards are tested through them: several slots in one call."""
    widths = []
    if name in BATCHED_FORWARDS:
        module, function = BATCHED_FORWARDS[name]
        batched = getattr(importlib.import_module(module), function)

        def counted(drafters, ctxs, gammas, *args):
            widths.append(sum(g > 0 for g in gammas))
            return batched(drafters, ctxs, gammas, *args)

        monkeypatch.setattr(f"{module}.{function}", counted)
    fit = assert_lossless_batched(_registered(name, **options), samples=SAMPLES, require_depth=deep)
    assert fit.passed
    assert max(fit.depths.values()) >= 1, fit.depths  # drafted inside the batches, not plain passes only
    assert name not in BATCHED_FORWARDS or max(widths) > 1
