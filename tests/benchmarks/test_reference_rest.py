"""Our rest beside REST's own retriever (DraftRetriever 0.1.0), from the fixture benchmarks/reference_rest.py wrote
(the reference run in its Python 3.9 side venv on a datastore of our datastore's tokens; this test needs neither).

On the fixture's Spec-Bench prompts with the fixture's options, ours must give the greedy text recorded there and an
overall tau within TOLERANCE of REST's (its greedy-replay tau, the mean over the recorded
repeats: its tree search breaks ties in hash order). Slow: the real target and its zoo-corpus datastore.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import specfamily as sf

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).resolve().parents[2] / "benchmarks" / "fixtures" / "reference_rest.json"
TOLERANCE = 0.03  # |ours / REST - 1| on overall tau; why this much: docs/reference-packages.md


@pytest.fixture(scope="module")
def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def _reference_tau(fixture: dict, name: str) -> float:
    tokens = sum(len(g) for g in fixture["greedy"])
    return statistics.mean(tokens / sum(repeat) for repeat in fixture["reference_passes"][name])


def test_the_fixture_holds_rests_own_retriever_at_stated_settings(fixture):
    assert fixture["packages"]["REST"] == "0.1.0"
    assert len(fixture["prompts"]) == len(fixture["greedy"]) >= 8
    assert _reference_tau(fixture, "REST") == pytest.approx(fixture["overall"]["REST_mean"])
    assert fixture["overall"]["REST_mean"] > 1.0  # REST's retrieval hit: not two plain decoders compared


def test_our_rest_gives_the_greedy_text_and_rests_tau_within_the_tolerance(fixture):
    target = sf.load_target(fixture["target"])
    from specfamily.drafters.rest.default_store import build_default
    from specfamily.drafters.rest.drafter import corpus_datastore

    store = corpus_datastore(target)  # the fixture's datastore: the zoo corpus's (zoo:smollm2's default is chat text)
    if not (store / "meta.json").is_file():
        build_default(store, target.tokenizer, target.vocab_size)
    drafter = sf.create_drafter("rest", target, gamma=fixture["continuation"], policy=None,
                                datastore=str(store), min_span=fixture["min_span"],
                                max_span=fixture["max_span"], continuation=fixture["continuation"],
                                max_matches=fixture["max_matches"], max_tree_size=fixture["max_tree_size"])
    tokens = passes = hits = 0
    for prompt, greedy in zip(fixture["prompts"], fixture["greedy"], strict=True):
        result = sf.generate(target, drafter, prompt, max_new_tokens=fixture["max_new_tokens"])
        assert result.tokens == greedy
        tokens += len(result.tokens)
        passes += result.metrics.target_passes
        hits += sum(len(accepted) for accepted in result.trace.accepted)
        assert max(len(draft) for draft in result.trace.draft_tokens) <= fixture["max_tree_size"]
    assert hits > 0  # retrieved tokens were accepted
    ours, rest = tokens / passes, _reference_tau(fixture, "REST")
    assert abs(ours / rest - 1) <= TOLERANCE, (ours, rest)
