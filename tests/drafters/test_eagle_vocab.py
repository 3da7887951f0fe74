"""EAGLE over a reduced draft vocabulary (FR-Spec) and trained on self-distillation data with stored features."""

from __future__ import annotations

import json

import pytest
import torch
from eval_helpers import chat_tokenizer, tiny_llama

import specfamily as sf
from specfamily.drafters.eagle.checkpoint import load_eagle, save_eagle
from specfamily.drafters.eagle.model import build_model
from specfamily.drafters.eagle.train import TrainConfig, train
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.recipes import user_turns
from specfamily.recipes.distill import DistillConfig, distill
from specfamily.testing import tiny_target
from specfamily.testing.tiny import single_thread

IDS = [0, 3, 5, 8, 13, 21, 34, 55]


@pytest.mark.parametrize("mode", ["tree", "chain"])
def test_drafts_stay_in_the_draft_vocabulary_and_greedy_text_is_the_targets(mode):
    target = tiny_target("llama", vocab_size=64, spread=2.0, dtype=torch.float32)
    drafter = sf.create_drafter("eagle", target, weights="random", draft_vocab=IDS, mode=mode, gamma=3)
    assert drafter.model.logits(torch.zeros(target.hidden_size)).shape == (len(IDS),)
    drafted: list[int] = []
    propose = drafter.propose
    drafter.propose = lambda ctx, gamma: (d := propose(ctx, gamma), drafted.extend(d.tokens.tolist()))[0]
    prompt = [1, 2, 3, 4]
    with single_thread():
        assert sf.generate(target, drafter, prompt, 24).tokens == sf.generate(target, None, prompt, 24).tokens
    assert drafted and set(drafted) <= set(IDS)


def test_sampled_chain_reports_q_over_the_whole_vocabulary_with_zeros_outside():
    target = tiny_target("llama", vocab_size=64, spread=2.0, dtype=torch.float32)
    drafter = sf.create_drafter("eagle", target, weights="random", draft_vocab=IDS, mode="chain", gamma=3)
    seen = []
    propose = drafter.propose
    drafter.propose = lambda ctx, gamma: (d := propose(ctx, gamma), seen.append(d))[0]
    with single_thread():
        sf.generate(target, drafter, [1, 2, 3], 8, sf.SamplingConfig(temperature=0.8))
    q = torch.cat([d.q for d in seen if d.q is not None])
    outside = torch.ones(64, dtype=torch.bool)
    outside[IDS] = False
    assert q.shape[-1] == 64 and torch.all(q[:, outside] == 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(q.shape[0], dtype=q.dtype))


def test_the_draft_vocabulary_is_saved_with_the_weights(tmp_path):
    target = tiny_target("llama", vocab_size=64, spread=2.0, dtype=torch.float32)
    counts = torch.tensor([9, 1, 8, 2, 7, 3, 6, 4])
    model = build_model(target.model, seed=2, vocab=DraftVocab(torch.tensor(IDS), 64, counts))
    save_eagle(tmp_path / "eagle", model, target.model, dtype=torch.float16)
    loaded, config = load_eagle(tmp_path / "eagle", target.model)
    assert config["draft_vocab"] == len(IDS) and loaded.vocab.ids.tolist() == IDS
    assert loaded.vocab.ids.dtype == torch.long
    hidden = torch.randn(3, target.hidden_size)
    assert torch.equal(loaded.head_weight, model.head_weight)
    assert loaded.logits(hidden).shape == (3, len(IDS)) and torch.equal(loaded.vocab.counts, counts)
    with pytest.raises(ValueError, match="draft_vocab list of ids applies to weights='random'"):
        sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), draft_vocab=IDS)
    smaller = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), draft_vocab=3)
    assert smaller.model.vocab.ids.tolist() == [0, 5, 13]  # the three most counted: 9, 8 and 7
    torch.testing.assert_close(smaller.model.logits(hidden), model.logits(hidden)[:, [0, 2, 4]])
    full = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), draft_vocab="full")
    assert full.model.vocab is None and full.model.logits(hidden).shape == (3, 64)
    with pytest.raises(ValueError, match="needs 1..8 tokens, got 9"):
        sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), draft_vocab=9)
    with pytest.raises(ValueError, match="draft_vocab must be 'full', a size >= 1 or a list of ids, got 'half'"):
        sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), draft_vocab="half")


@pytest.fixture
def distilled(tmp_path, monkeypatch):
    """A tiny chat target and self-distillation data from it (code requests about two fixed functions)."""
    folder = tmp_path / "target"
    tokenizer = chat_tokenizer()
    model = tiny_llama(seed=3, layers=2)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    monkeypatch.setattr(user_turns, "corpus_functions", lambda: [f"def f{i}(a):\n    return a + {i}" for i in range(9)])
    with single_thread():
        distill(DistillConfig(out=str(tmp_path / "data"), target=str(folder), conversations=12, batch=4,
                              answer_tokens=24, code_share=1.0))
    return folder, tmp_path / "data"


def test_training_on_distilled_features_with_a_draft_vocabulary_exports_and_resumes(distilled, tmp_path):
    folder, data = distilled
    options = {"target": str(folder), "distilled": str(data), "draft_vocab": 40, "heldout_fraction": 0.3,
               "steps": 4, "minutes": 0.0, "batch": 2, "seq_len": 16, "eval_every": 2, "eval_windows": 2,
               "tau_prompts": 2, "tau_tokens": 6, "threads": 1}
    state = train(TrainConfig(out=str(tmp_path / "eagle"), **options))
    assert state.step == 4 and state.tokens_seen == 4 * 2 * 16
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert config["draft_vocab"] == 40
    target = sf.load_target(str(folder))
    drafter = sf.create_drafter("eagle", target, weights=str(tmp_path / "eagle"), gamma=3)
    assert drafter.model.vocab.size == 40 and target.eos_token_id in drafter.model.vocab.ids.tolist()
    more = train(TrainConfig(out=str(tmp_path / "eagle"), **{**options, "steps": 6}))
    assert more.step == 6  # resumed at step 4
    with pytest.raises(ValueError, match="was trained with another draft vocabulary"):
        train(TrainConfig(out=str(tmp_path / "eagle"), **{**options, "steps": 8, "draft_vocab": 30}))


def test_a_draft_vocabulary_from_a_hydra_config_is_a_list_of_ids():
    from omegaconf import OmegaConf

    target = tiny_target("llama", vocab_size=64, spread=2.0, dtype=torch.float32)
    ids = OmegaConf.create({"draft_vocab": IDS}).draft_vocab  # a ListConfig, as drafter.draft_vocab=[...] gives
    drafter = sf.create_drafter("eagle", target, weights="random", draft_vocab=ids, mode="chain", gamma=2)
    assert drafter.model.vocab.ids.tolist() == IDS
    assert drafter.model.vocab.ids.device == target.model.get_output_embeddings().weight.device
