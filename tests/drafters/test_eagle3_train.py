"""EAGLE-3 training-time test: the unrolled mask, the simulated acceptance length, training lowers the loss, the
exported drafter (draft vocabulary from token frequency) loads and is lossless through the shared verifier."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import specfamily as sf
from specfamily.drafters.eagle.model3 import Eagle3Shape, build_model, default_layers, draft_layer_config
from specfamily.drafters.eagle.storage import read_tensors
from specfamily.drafters.eagle.train import Eagle3TrainConfig as TrainConfig
from specfamily.drafters.eagle.train import train
from specfamily.drafters.eagle.ttt import (
    simulated_acceptance,
    step_weights,
    target_pass,
    ttt_objective,
    unroll,
    unrolled_visible,
)
from specfamily.testing import SAMPLING_MATRIX, assert_lossless, tiny_target


def test_simulated_acceptance_by_hand():
    # 1 + a1 + a1 a2 + a1 a2 a3
    assert simulated_acceptance([0.5, 0.5, 1.0]) == pytest.approx(1 + 0.5 + 0.25 + 0.25)
    assert simulated_acceptance([0.8, 0.5]) == pytest.approx(1 + 0.8 + 0.4)
    assert simulated_acceptance([0.0, 1.0, 1.0]) == 1.0
    assert simulated_acceptance([1.0] * 7) == 8.0
    assert step_weights(3) == pytest.approx([1.0, 0.8, 0.64])


def test_unrolled_mask_is_the_references():
    """Step s at index t reads the step-0 keys j <= t - s and, of each later step, only its own index."""
    assert torch.equal(unrolled_visible(4, 0).int(), torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0],
                                                                    [1, 1, 1, 1]]))
    expected = torch.tensor([[0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0],
                             [0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0],
                             [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0],
                             [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]])
    assert torch.equal(unrolled_visible(4, 2).int(), expected)


def _tiny_drafter(vocab_size=16, layers=4):
    target = tiny_target("llama", vocab_size=vocab_size, layers=layers, dtype=torch.float64)
    shape = Eagle3Shape(draft_layer_config(target.model), default_layers(layers))
    return target, build_model(target.model, shape, seed=3)


def test_no_step_sees_the_future():
    """Step s at index t reads tokens up to x[t + 1 + s] and target features up to t: changing anything later
    leaves it exactly as it was, while changing x[t + 1 + s] itself moves it."""
    target, model = _tiny_drafter()
    gen = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 16, (2, 14), generator=gen)
    features, _ = target_pass(target.model, windows, model.shape.layers)
    outputs = unroll(model, windows, features, 4)
    t = 5
    for step in range(4):
        later = windows.clone()
        later[:, t + 2 + step :] = (later[:, t + 2 + step :] + 1) % 16
        moved = features.clone()
        moved[:, t + 1 :] += torch.randn(moved[:, t + 1 :].shape, generator=gen, dtype=moved.dtype)
        again = unroll(model, later, moved, 4)[step]
        assert torch.equal(again[:, t], outputs[step][:, t]), step
        assert not torch.equal(again[:, t + 1], outputs[step][:, t + 1]), step  # later indices did change
        own = windows.clone()
        own[:, t + 1 + step] = (own[:, t + 1 + step] + 1) % 16
        assert not torch.allclose(unroll(model, own, features, 4)[step][:, t], outputs[step][:, t]), step


def test_each_step_is_the_chain_it_simulates_fed_through_the_drafting_cache():
    """Step s at index t equals the ordinary cached layer call that reads the pairs 0 .. t - s causally, then one
    query at a time the step k <= s inputs at index t (the step k - 1 output and x[t + 1 + k]) at position t + k."""
    target, model = _tiny_drafter()
    windows = torch.randint(0, 16, (1, 13), generator=torch.Generator().manual_seed(2))
    features, _ = target_pass(target.model, windows, model.shape.layers)
    outputs = unroll(model, windows, features, 4)
    fused = model.fuse(features[:, :12])
    for t in (3, 5, 8):  # every step reads a token inside the window: t + 1 + step <= 12
        for step in range(min(4, t + 1)):
            cache, n = DynamicCache(), t - step + 1
            out = model(windows[:, 1 : n + 1], fused[:, :n], torch.arange(n)[None], None, cache)[:, -1:]
            for k in range(1, step + 1):
                out = model(windows[:, t + 1 + k : t + 2 + k], outputs[k - 1][:, t : t + 1],
                            torch.tensor([[t + k]]), None, cache)
            torch.testing.assert_close(out[:, 0], outputs[step][:, t], rtol=1e-9, atol=1e-9)


def test_objective_weights_steps_and_counts_only_scored_positions():
    target, model = _tiny_drafter()
    windows = torch.randint(0, 16, (3, 12), generator=torch.Generator().manual_seed(1))
    features, logits = target_pass(target.model, windows, model.shape.layers)
    result = ttt_objective(model, windows, features, logits, ttt_length=3)
    assert result.counts.tolist() == [3 * 11, 3 * 10, 3 * 9]
    weighted = (result.step_losses * torch.tensor([1, 0.8, 0.64])).sum()
    assert float(result.loss.detach()) == pytest.approx(float(weighted))
    assert bool((result.hits <= result.counts).all())
    with pytest.raises(ValueError, match="windows of 5 tokens are too short for 4 unrolled steps"):
        ttt_objective(model, windows[:, :5], features[:, :5], logits[:, :5], ttt_length=4)


def _tokens(tmp_path, vocab_size, n=20000, seed=0):
    """A token file whose ids are drawn with falling frequencies (id 0 the most frequent)."""
    weights = 1.0 / np.arange(1, vocab_size + 1)
    tokens = np.random.default_rng(seed).choice(vocab_size, size=n, p=weights / weights.sum()).astype(np.int32)
    path = tmp_path / "tokens.npy"
    np.save(path, tokens)
    return path


def _config(tmp_path, tokens, **options):
    base = dict(target="tiny", out=str(tmp_path / "eagle3"), tokens=str(tokens), minutes=0, seq_len=24,
                ttt_length=3, batch=8, lr=3e-3, warmup=5, eval_windows=16, save_dtype="float32", threads=1)
    return TrainConfig(**{**base, **options})


def test_training_lowers_the_loss_and_raises_the_simulated_acceptance(tmp_path):
    target = tiny_target("llama", vocab_size=32, layers=4, dtype=torch.float32, spread=2.0)
    cfg = _config(tmp_path, _tokens(tmp_path, 32), steps=1, eval_every=1)
    first = train(cfg, target)
    cfg = _config(tmp_path, _tokens(tmp_path, 32), steps=150, eval_every=50, ckpt=str(tmp_path / "more.pt"))
    last = train(cfg, target)
    # the loss is a cross-entropy against the target's soft labels: its floor is their entropy (about 8.4 here)
    assert last.last_loss < first.last_loss - 0.05, (first.last_loss, last.last_loss)
    assert last.best_acceptance > first.last_acceptance + 0.3, (first.last_acceptance, last.best_acceptance)
    assert len(last.last_accuracies) == 3


def test_exported_drafter_loads_with_a_frequency_vocabulary_and_is_lossless(tmp_path):
    """Trained on the conformance kit's own tiny target, exported, loaded by name: d2t/t2d name the most frequent
    training tokens, and generations through the shared verifier follow the target's law."""
    target = tiny_target("llama")  # the kit's target (vocabulary 8, float64)
    cfg = _config(tmp_path, _tokens(tmp_path, 8), steps=30, eval_every=15, draft_vocab=6)
    state = train(cfg, target)
    assert state.best_step in (15, 30)
    tensors = read_tensors(tmp_path / "eagle3")
    assert tensors["t2d"].tolist() == [True] * 6 + [False] * 2  # ids 0..5 are the most frequent
    assert (torch.arange(6) + tensors["d2t"]).tolist() == list(range(6))
    drafter = sf.create_drafter("eagle3", target, weights=str(tmp_path / "eagle3"), mode="chain", gamma=3)
    assert drafter.model.vocab.ids.tolist() == list(range(6))
    assert_lossless(lambda t: sf.create_drafter("eagle3", t, weights=str(tmp_path / "eagle3"), mode="chain",
                                                gamma=3), configs=SAMPLING_MATRIX[:2], min_depth=2)


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="seq_len 8 is too short for 7 unrolled steps"):
        TrainConfig(target="t", out="o", tokens="x.npy", seq_len=8)
    with pytest.raises(ValueError, match="ttt_length must be >= 1, got 0"):
        TrainConfig(target="t", out="o", tokens="x.npy", ttt_length=0)
    with pytest.raises(ValueError, match="layers must be comma-separated integers, got '2,x'"):
        TrainConfig(target="t", out="o", tokens="x.npy", layers="2,x")
    with pytest.raises(ValueError, match="give exactly one data source"):
        TrainConfig(target="t", out="o")


def test_a_rerun_resumes_and_other_options_are_refused(tmp_path):
    target = tiny_target("llama", vocab_size=16, layers=4, dtype=torch.float32)
    tokens = _tokens(tmp_path, 16)
    first = train(_config(tmp_path, tokens, steps=3, eval_every=3), target)
    assert first.step == 3
    resumed = train(_config(tmp_path, tokens, steps=5, eval_every=5), target)
    assert resumed.step == 5 and resumed.tokens_seen == 5 * 8 * 24  # 2 more steps, not 5
    with pytest.raises(ValueError, match=r"options \['ttt_length'\] differ from the saved run; use another --ckpt"):
        train(_config(tmp_path, tokens, steps=6, ttt_length=2), target)


def test_distilled_conversations_train_with_features_from_the_target(tmp_path):
    """The distillation files' stored (last-layer) features are not EAGLE-3's three layers: the trainer reads the
    conversations and computes the layers online; the draft vocabulary is counted on the answers."""
    from specfamily.drafters.shared.draft_vocab import frequent_tokens
    from specfamily.recipes.distill import DistillConfig, write_batch
    from specfamily.train.distilled import is_heldout, load_distilled

    target = tiny_target("llama", vocab_size=32, layers=4, dtype=torch.float32, spread=2.0)
    gen = torch.Generator().manual_seed(0)
    turns = [t for t in (f"turn {i}" for i in range(5000)) if not is_heldout(t)][:8]
    turns += [t for t in (f"turn {i}" for i in range(5000)) if is_heldout(t)][:2]
    prompts, convs = [], []
    for _ in turns:
        prompt = torch.randint(0, 32, (1, 6), generator=gen)
        out = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                    max_new_tokens=30, min_new_tokens=30, pad_token_id=0)
        prompts.append(prompt[0].tolist())
        convs.append((out[0].tolist(), torch.zeros(out.shape[1] - 1, 32)))  # stored features: never read
    write_batch(DistillConfig(out=str(tmp_path / "distilled")), 0, turns, prompts, convs)
    cfg = _config(tmp_path, "", distilled=str(tmp_path / "distilled"), steps=4, eval_every=4, draft_vocab=10)
    state = train(cfg, target)
    assert state.step == 4 and 1.0 <= state.best_acceptance <= 4.0
    answers = load_distilled(tmp_path / "distilled")[0].answer_tokens()
    drafter = sf.create_drafter("eagle3", target, weights=cfg.out)
    assert torch.equal(drafter.model.vocab.ids, frequent_tokens(answers, 10, 32).ids)


def test_speculators_layout_export_loads_with_the_same_weights(tmp_path):
    import json

    target = tiny_target("llama", vocab_size=16, layers=4, dtype=torch.float32)
    train(_config(tmp_path, _tokens(tmp_path, 16), steps=2, eval_every=2, layout="speculators", layers="1,2,3",
                  base_model="org/tiny-llama"), target)
    config = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    saved = torch.load(tmp_path / "eagle3.train.pt", weights_only=True)["best"]
    loaded = sf.create_drafter("eagle3", target, weights=str(tmp_path / "eagle3")).model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in saved.items())
    with pytest.raises(ValueError, match="layout must be one of"):
        _config(tmp_path, "x.npy", layout="vllm")
