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
    trials, plain = measure_trials(target, model, prompts, 12, candidates=((2, 3), (3, 5)), chains=(2,))
    assert [(t.mode, t.gamma, t.total_tokens) for t in trials] == [("tree", 2, 3), ("tree", 3, 5), ("chain", 2, 2)]
    assert plain > 0 and all(t.identical and t.tau >= 1.0 and t.speedup > 0 for t in trials)
    tree_wins = [Trial(2, 3, 1.5, 1.0, 1.3, True), Trial(3, 5, 1.6, 1.1, 1.2, True),
                 Trial(2, 2, 1.4, 1.2, 1.1, True, "chain")]
    chosen = write_calibration(tmp_path / "eagle", tree_wins, plain, {"prompts": "tiny"})
    saved = json.loads((tmp_path / "eagle" / "config.json").read_text())["calibration"]
    assert (saved["mode"], saved["gamma"], saved["total_tokens"]) == ("tree", 2, 3) == (chosen.mode, 2, 3)
    drafter = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"))
    assert (drafter.mode, drafter.policy.next_gamma(), drafter.total_tokens) == ("tree", 2, 3)
    explicit = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), gamma=2, total_tokens=7)
    assert (explicit.policy.next_gamma(), explicit.total_tokens) == (2, 7)
    chain = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), mode="chain")
    assert chain.policy.next_gamma() == 4  # the calibration is for trees


def test_a_calibrated_chain_becomes_the_default_mode(tmp_path):
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    save_eagle(tmp_path / "eagle", build_model(target.model, seed=3), target.model)
    chain_wins = [Trial(2, 3, 1.5, 1.0, 1.1, True), Trial(3, 3, 1.9, 0.8, 1.4, True, "chain")]
    write_calibration(tmp_path / "eagle", chain_wins, 1.0, {})
    drafter = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"))
    assert (drafter.mode, drafter.policy.next_gamma()) == ("chain", 3)
    tree = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), mode="tree")
    assert (tree.mode, tree.policy.next_gamma(), tree.total_tokens) == ("tree", 5, 12)  # the uncalibrated defaults


def test_a_shape_that_changed_the_output_is_never_chosen():
    fast_but_wrong = Trial(5, 12, 3.0, 1.0, 2.0, identical=False)
    slow = Trial(3, 4, 1.5, 2.0, 1.1, identical=True)
    assert best_trial([fast_but_wrong, slow]) == slow
    with pytest.raises(RuntimeError, match="no EAGLE tree shape reproduced plain greedy decoding"):
        best_trial([fast_but_wrong])


def test_the_calibration_times_the_products_decoding_will_use(monkeypatch):
    """The target is loaded with matmul auto (as the default run loads it), not the exact kind, unless asked."""
    from specfamily.drafters.eagle import calibrate

    seen = []

    def loading(name, dtype=None, matmul="exact"):
        seen.append(matmul)
        raise RuntimeError("loaded")

    monkeypatch.setattr("specfamily.core.target.load_target", loading)
    for extra in ([], ["--matmul", "exact"]):
        with pytest.raises(RuntimeError, match="loaded"):
            calibrate.main(["--target", "zoo:smollm2", "--weights", "w", *extra])
    assert seen == ["auto", "exact"]
