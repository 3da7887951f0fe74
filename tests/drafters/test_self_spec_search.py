import json

import pytest
import torch

import specfamily as sf
from specfamily.drafters.self_spec.calibration import CostModel, calibrate
from specfamily.drafters.self_spec.config import load_skip_set, model_key
from specfamily.drafters.self_spec.drafter import SelfSpecDrafter
from specfamily.drafters.self_spec.layers import LayerRunner, all_sublayers, draft_entries_discarded, parse_skip
from specfamily.drafters.self_spec.search import (
    Candidate,
    SearchOptions,
    acceptance_by_depth,
    band_logits,
    beam_search,
    greedy_tau,
    main,
    ranked_search,
    search_skip_set,
)
from specfamily.testing import tiny_model, tiny_target

GREEDY = sf.SamplingConfig()
PROMPTS = [[1, 5, 9, 2, 7], [3, 3, 8, 1, 4, 6, 2]]


def _flat_costs(num_layers: int, depth: int) -> CostModel:
    """t(1) = 1; every sub-layer costs 0.1 of it, the rest of a draft step 0.1; verifying is free of length."""
    return CostModel(t1=1.0, verify_cost=[1.0] * (depth + 1), fixed=0.1, attn=0.1, mlp=0.1, num_layers=num_layers)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@torch.inference_mode()
def test_band_logits_equal_what_propose_computes(family):
    """Each band row equals the incremental draft pass over the target's cache of the prefix before its root."""
    target = tiny_target(family, vocab_size=64, spread=1.0)
    runner = LayerRunner(target.model)
    plan = runner.plan(parse_skip(["mlp:1"], 2))
    calibration = calibrate(target, PROMPTS[:1], 6, GREEDY)[0]
    ids, first_root, depth = calibration.ids, calibration.prompt_len - 1, 3
    for phase in range(depth):
        band = band_logits(runner, calibration, plan, depth, phase)
        for j in range(band.shape[0]):
            root = first_root + phase + j - j % depth
            target.reset()
            target.forward(ids[:root])
            target.commit([])
            with draft_entries_discarded(target.cache, root) as cache:
                for position in range(root, first_root + phase + j + 1):  # the chain follows the text
                    hidden = runner.hidden(ids[position : position + 1].view(1, 1), torch.tensor([[position]]),
                                           None, cache, plan)
            torch.testing.assert_close(runner.logits(hidden)[0, -1], band[j], rtol=0, atol=1e-10)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@torch.inference_mode()
def test_skipping_the_last_layer_accepts_where_the_truncated_model_agrees(family):
    """Layer 0's keys are the same in the target and in the model without layer 1, so at every root and depth the
    draft of skip ["layer:1"] is the truncated model's argmax at that position."""
    target = tiny_target(family, vocab_size=64, spread=1.0)
    runner = LayerRunner(target.model)
    calibration = calibrate(target, PROMPTS[1:], 16, GREEDY)[0]
    accepted = acceptance_by_depth(runner, calibration, runner.plan(parse_skip(["layer:1"], 2)), 3, GREEDY)
    truncated = tiny_model(family, 64, spread=1.0)
    base = truncated.transformer if family == "gpt2" else truncated.model
    if family == "gpt2":
        base.h = base.h[:1]
    else:
        base.layers = base.layers[:1]
    ids = calibration.ids.view(1, -1)
    top = truncated(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].argmax(-1)
    first, n = calibration.prompt_len - 1, accepted.shape[1]
    agree = (top[first : first + n] == calibration.top).double()  # (n,) by position
    assert 0 < agree.sum() < n  # the test can fail both ways
    for d in range(3):
        torch.testing.assert_close(accepted[d, : n - d], agree[d:], rtol=0, atol=0)
        assert bool(accepted[d, n - d :].isnan().all())


def test_greedy_tau_counts_passes_exactly():
    accepted = torch.tensor([[1, 0, 1, 1, 0, 1], [1, 0, 0, 1, 0, float("nan")]], dtype=torch.float64)
    # root 0: 2 accepted -> 3 tokens, root 3: 2 accepted -> 3 tokens: 6 tokens in 2 passes
    assert greedy_tau(accepted, 2) == 3.0
    # gamma 1: root 0 -> 2, root 2 -> 2, root 4 -> 1 (rejected), root 5 -> 1 (the last token)
    assert greedy_tau(accepted, 1) == 6 / 4


def _additive_score(good: dict) -> callable:
    def score(skipped):
        value = 1.0 + sum(good.get(k, -0.05) for k in skipped)
        return Candidate(skipped, value, 1, 1.0, 0.5, 1.0)

    return score


def test_beam_search_finds_the_best_set_and_respects_max_skip():
    sublayers = all_sublayers(3)
    good = {("mlp", 0): 0.2, ("attn", 2): 0.1, ("mlp", 2): 0.05}
    best, history = beam_search(_additive_score(good), sublayers, beam=2, patience=1)
    assert best.skipped == frozenset(good)
    assert len({c.skipped for c in history}) == len(history)
    best, _ = beam_search(_additive_score(good), sublayers, beam=1, max_skip=1)
    assert best.skipped == {("mlp", 0)}


def test_ranked_search_scores_singles_then_nested_sets_of_the_best_ranked():
    """Six sub-layers: 1 + 6 singles + 3 nested sets (k = 2, 4, 6); the best prefix is the two good ones."""
    sublayers = all_sublayers(3)
    good = {("mlp", 0): 0.2, ("attn", 2): 0.1}
    seen = []
    score = _additive_score(good)
    best, history = ranked_search(lambda s: seen.append(s) or score(s), sublayers)
    assert len(seen) == len(history) == 1 + 6 + 3
    assert seen[7] == frozenset(good) and best.skipped == frozenset(good)
    best, _ = ranked_search(score, sublayers, max_skip=1)
    assert best.skipped == {("mlp", 0)}


def test_search_min_skip_picks_the_best_set_that_skips_something():
    """Skipping anything loses here; min_skip=1 still returns the least bad non-empty set, scored by the search."""
    model = tiny_model("llama", vocab_size=16, layers=2, dtype=torch.float32)
    target = sf.load_target(model)
    prompts = [[1, 2, 3, 4, 5, 6]]
    costs = CostModel(t1=1.0, verify_cost=[1.0] * 5, fixed=0.5, attn=0.0, mlp=0.0, num_layers=2)
    options = SearchOptions(prompts=1, max_new_tokens=8, depth=2, strategy="ranked", validate=False, repeats=1)
    best, history, _ = search_skip_set(target, options, prompts, costs)
    assert best.skipped == frozenset()  # skipping saves nothing at attn = mlp = 0 and can only lose acceptance
    best, history, _ = search_skip_set(target, SearchOptions(**{**vars(options), "min_skip": 1}), prompts, costs)
    assert len(best.skipped) >= 1
    assert best.speedup == max(c.speedup for c in history if c.skipped)


def test_beam_search_stops_after_patience():
    calls = []

    def score(skipped):
        calls.append(skipped)
        return Candidate(skipped, 1.0 - 0.1 * len(skipped), 1, 1.0, 0.5, 1.0)

    best, _ = beam_search(score, all_sublayers(4), beam=1, patience=0)
    assert best.skipped == frozenset()
    assert max(len(s) for s in calls) == 1


def _with_identity_layer(layers: int, identity: int):
    model = tiny_model("llama", 64, seed=3, spread=4.0, layers=layers)
    with torch.no_grad():
        model.model.layers[identity].self_attn.o_proj.weight.zero_()
        model.model.layers[identity].mlp.down_proj.weight.zero_()
    return sf.load_target(model)


def test_search_finds_that_skipping_an_identity_layer_is_free():
    target = _with_identity_layer(4, identity=2)
    runner = LayerRunner(target.model)
    options = SearchOptions(max_new_tokens=8, depth=2, beam=1, validate=False)
    calibrations = calibrate(target, PROMPTS, 8, GREEDY)
    def accepted(skip):
        plan = runner.plan(parse_skip(skip, 4))
        alphas = torch.cat([acceptance_by_depth(runner, cal, plan, 2, GREEDY).reshape(-1) for cal in calibrations])
        return alphas[~alphas.isnan()]

    assert bool((accepted(["layer:2"]) == 1).all())
    assert bool((accepted(["attn:1"]) < 1).any())  # skipping a real sub-layer is not free
    best, history, _ = search_skip_set(target, options, PROMPTS, costs=_flat_costs(4, 2))
    assert {("attn", 2), ("mlp", 2)} <= best.skipped
    assert best.alpha <= 1.0 and best.speedup > history[0].speedup


def test_command_writes_a_record_the_drafter_loads(tmp_path):
    model = tiny_model("llama", 4096, seed=5, dtype=torch.float32, spread=1.0)
    model.save_pretrained(tmp_path / "model")
    out = tmp_path / "skip.json"
    args = ["--model", str(tmp_path / "model"), "--out", str(out), "--prompt-set", "continue", "--prompts", "2",
            "--max-new-tokens", "6", "--max-prompt-tokens", "24", "--depth", "2", "--repeats", "2", "--device", "cpu"]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["model"]["name"] == str(tmp_path / "model")
    assert data["measured"]["identical_to_plain"] is True
    record = load_skip_set(out)
    target = sf.load_target(str(tmp_path / "model"), device="cpu")
    assert record.model == model_key(target.model, str(tmp_path / "model"))
    drafter = SelfSpecDrafter(target, skip=str(out))
    assert drafter.skipped == parse_skip(record.skip, 2)
    assert not list(tmp_path.glob(".skip.json.*"))  # no temporary file left behind
