import json

import pytest

import specfamily as sf
from specfamily.drafters.eagle.calibrate import Trial, best_trial, measure_trials, write_calibration
from specfamily.drafters.eagle.checkpoint import save_eagle
from specfamily.drafters.eagle.model import build_model
from specfamily.testing import tiny_target


def test_the_fastest_exact_shape_becomes_the_checkpoints_default(tmp_path):
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    model = build_model(target.model, seed=3)
    save_eagle(tmp_path / "eagle", model, target.model)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    trials, plain = measure_trials(target, model, prompts, 12, candidates=((2, 3), (3, 5)))
    assert [(t.gamma, t.total_tokens) for t in trials] == [(2, 3), (3, 5)] and plain > 0
    assert all(t.identical and t.tau >= 1.0 and t.speedup > 0 for t in trials)
    chosen = write_calibration(tmp_path / "eagle", trials, plain, {"prompts": "tiny"})
    saved = json.loads((tmp_path / "eagle" / "config.json").read_text())["calibration"]
    assert (saved["gamma"], saved["total_tokens"]) == (chosen.gamma, chosen.total_tokens)
    drafter = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"))
    assert (drafter.policy.next_gamma(), drafter.total_tokens) == (chosen.gamma, chosen.total_tokens)
    explicit = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), gamma=2, total_tokens=7)
    assert (explicit.policy.next_gamma(), explicit.total_tokens) == (2, 7)
    chain = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), mode="chain")
    assert chain.policy.next_gamma() == 4  # the calibration is for trees


def test_a_shape_that_changed_the_output_is_never_chosen():
    fast_but_wrong = Trial(5, 12, 3.0, 1.0, 2.0, identical=False)
    slow = Trial(3, 4, 1.5, 2.0, 1.1, identical=True)
    assert best_trial([fast_but_wrong, slow]) == slow
    with pytest.raises(RuntimeError, match="no EAGLE tree shape reproduced plain greedy decoding"):
        best_trial([fast_but_wrong])
