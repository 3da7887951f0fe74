"""Self-distillation data: user turns, answers with their features from the same generation, resume, workers."""

from __future__ import annotations

import json

import pytest
import torch
from eval_helpers import chat_tokenizer, tiny_llama
from safetensors import safe_open

from specfamily.recipes import user_turns
from specfamily.recipes.distill import DistillConfig, batch_path, distill, is_code_batch, report
from specfamily.testing.tiny import single_thread
from specfamily.train.distilled import WindowSampler, load_distilled

SNIPPETS = ["def add(a, b):\n    return a + b", "def twice(x):\n    y = x * 2\n    return y"]


@pytest.fixture(autouse=True)
def few_snippets(monkeypatch):
    """Code requests about two fixed functions (parsing the standard library is tested once, below)."""
    monkeypatch.setattr(user_turns, "corpus_functions", lambda: SNIPPETS)


def test_corpus_functions_come_from_the_zoo_corpus():
    found = user_turns.functions(["import os\n\ndef f(a):\n    b = a\n    c = b\n    return c\n", "def ("])
    assert found == ["def f(a):\n    b = a\n    c = b\n    return c"]
    requests = user_turns.code_requests(found, 3, seed=1)
    assert len(requests) == 3 and all(user_turns.is_code_request(r) and found[0] in r for r in requests)


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    """A tiny Llama with a chat template, saved as a folder the way a user's target is."""
    folder = tmp_path_factory.mktemp("chat-target")
    tokenizer = chat_tokenizer()
    model = tiny_llama(seed=3, layers=2)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _config(out, target, **overrides) -> DistillConfig:
    options = {"conversations": 4, "batch": 2, "user_tokens": 3, "answer_tokens": 6, "code_share": 1.0,
               "feature_dtype": "float32", **overrides}
    return DistillConfig(out=str(out), target=str(target), **options)


def test_answers_carry_the_features_of_the_same_generation(chat_target, tmp_path):
    with single_thread():
        summary = distill(_config(tmp_path, chat_target))
    assert summary["batches_made"] == 2 and summary["remaining"] == 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_target, dtype=torch.float32).eval()
    with safe_open(str(batch_path(tmp_path, 0)), "pt") as handle:
        tokens, features = handle.get_tensor("tokens").long(), handle.get_tensor("features")
        starts, answer_starts = handle.get_tensor("starts"), handle.get_tensor("answer_starts")
        turns = json.loads(handle.metadata()["user_turns"])
    assert len(turns) == 2 and all(user_turns.is_code_request(t) for t in turns)
    assert features.shape[0] == tokens.numel() - len(turns)  # one row per token but each conversation's last
    for i in range(len(turns)):
        conv = tokens[starts[i] : starts[i + 1]]
        with torch.no_grad():
            out = model(conv[None], output_hidden_states=True)
        torch.testing.assert_close(features[starts[i] - i : starts[i + 1] - i - 1], out.hidden_states[-1][0, :-1],
                                   atol=1e-4, rtol=1e-4)
        answer = conv[answer_starts[i] :]
        assert answer.numel() >= 1
        greedy = out.logits[0, answer_starts[i] - 1 : -1].argmax(-1)
        assert torch.equal(greedy, answer)  # the answer is the target's own greedy text


def test_a_rerun_makes_only_missing_batches_and_workers_split_them(chat_target, tmp_path):
    with single_thread():
        distill(_config(tmp_path, chat_target, workers=2, worker=1))
        assert not batch_path(tmp_path, 0).exists() and batch_path(tmp_path, 1).exists()
        before = batch_path(tmp_path, 1).stat().st_mtime_ns
        summary = distill(_config(tmp_path, chat_target, conversations=6))
    assert [b["index"] for b in summary["batches"]] == [0, 2]
    assert batch_path(tmp_path, 1).stat().st_mtime_ns == before
    train, heldout = load_distilled(tmp_path)
    assert len(train) + len(heldout) == len(set(train.turns + heldout.turns)) <= 6
    assert report(tmp_path)["tokens"] == int(train.tokens.numel() + heldout.tokens.numel())


def test_unfinished_magpie_turns_are_dropped_and_the_batch_still_counts(chat_target, tmp_path):
    with single_thread():
        summary = distill(_config(tmp_path, chat_target, conversations=2, code_share=0.0, user_tokens=1))
    record = summary["batches"][0]
    assert record["asked"] == 2 and record["kept"] == 0 and record["code"] is False
    assert batch_path(tmp_path, 0).with_suffix(".empty").is_file()
    with pytest.raises(FileNotFoundError, match="no distillation batches"):
        load_distilled(tmp_path)


def test_code_batches_spread_evenly():
    cfg = DistillConfig(out="x", code_share=0.25, conversations=64, batch=4)
    assert [b for b in range(16) if is_code_batch(cfg, b)] == [3, 7, 11, 15]


def test_magpie_prefix_is_the_template_up_to_the_users_message():
    assert user_turns.user_prefix(chat_tokenizer()) == "<|user|>"


def test_turns_that_share_eight_words_with_spec_bench_are_dropped():
    keep = user_turns.spec_bench_filter()
    from specfamily.eval.datasets import shipped_set_path
    from specfamily.zoo.prompts import load_prompt_set

    question = load_prompt_set("", shipped_set_path("spec_bench"))["turns"][0][0]
    words = question.split()
    assert len(words) >= 8
    assert not keep.clean("Please help: " + " ".join(words[:8]) + " thanks")
    assert keep.clean("Write a short poem about the sea and a lighthouse keeper at night.")


def test_windows_stay_inside_one_conversation(chat_target, tmp_path):
    with single_thread():
        distill(_config(tmp_path, chat_target, conversations=8, answer_tokens=8))
    train, _ = load_distilled(tmp_path, percent=0.0)
    sampler = WindowSampler(train, 6)
    tokens, features = sampler.sample(16, torch.Generator().manual_seed(0))
    for window, feats in zip(tokens, features, strict=True):
        found = False
        for i in range(len(train)):
            conv_tokens, conv_features = train.conversation(i)
            for offset in range(conv_tokens.numel() - 6):
                if torch.equal(conv_tokens[offset : offset + 6], window) and \
                        torch.equal(conv_features[offset : offset + 6].float(), feats):
                    found = True
        assert found


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="worker must be in 0..1, got 2"):
        DistillConfig(out="x", workers=2, worker=2)
    with pytest.raises(ValueError, match="code_share must be in"):
        DistillConfig(out="x", code_share=1.5)


def test_a_small_draft_starts_from_the_targets_principal_embedding(chat_target, tmp_path):
    import numpy as np
    from transformers import AutoModelForCausalLM

    import specfamily as sf
    from specfamily.recipes.draft_init import DraftShape, distill_workdir, init_draft, principal_embedding

    target = sf.load_target(str(chat_target))
    weight = target.model.get_input_embeddings().weight.detach().float()
    full = principal_embedding(weight, weight.shape[1])  # all directions: a rotation, norms and products kept
    torch.testing.assert_close(full @ full.T * (weight.norm(dim=1).mean() / full.norm(dim=1).mean()) ** -2,
                               weight @ weight.T, atol=1e-3, rtol=1e-3)
    init_draft(target, tmp_path / "draft", DraftShape(layers=1, hidden=8, heads=2, kv_heads=1, intermediate=16))
    draft = AutoModelForCausalLM.from_pretrained(tmp_path / "draft")
    assert draft.get_input_embeddings().weight.shape == (weight.shape[0], 8)
    assert draft.config.tie_word_embeddings and draft.config.vocab_size == target.vocab_size
    with single_thread():
        distill(_config(tmp_path / "data", chat_target, conversations=8))
    counts = distill_workdir(tmp_path / "data", target, tmp_path / "work")
    train = np.load(tmp_path / "work" / "train.npy")
    assert train.dtype == np.uint16 and train.size == counts["train_tokens"] > 0
    assert (tmp_path / "work" / "tokenizer" / "tokenizer.json").is_file()


def test_both_engines_write_the_same_batches(chat_target, tmp_path):
    """The documented command reproduces the data of the generate() engine: same turns, answers, features."""
    with single_thread():
        for engine in ("generate", "fast"):
            distill(_config(tmp_path / engine, chat_target, conversations=4, code_share=0.5, user_tokens=8,
                            answer_tokens=10, engine=engine))
    made = sorted(p.name for p in (tmp_path / "generate").glob("batch-*"))
    assert made == sorted(p.name for p in (tmp_path / "fast").glob("batch-*"))
    assert any(name.endswith(".safetensors") for name in made)
    for name in made:
        if not name.endswith(".safetensors"):
            continue
        with safe_open(str(tmp_path / "generate" / name), "pt") as want, safe_open(str(tmp_path / "fast" / name),
                                                                                   "pt") as got:
            assert json.loads(got.metadata()["user_turns"]) == json.loads(want.metadata()["user_turns"])
            for key in ("tokens", "starts", "answer_starts"):
                assert torch.equal(got.get_tensor(key), want.get_tensor(key))
            torch.testing.assert_close(got.get_tensor("features"), want.get_tensor("features"), atol=1e-5, rtol=1e-5)


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine must be one of fast, generate, got 'beam'"):
        DistillConfig(out="x", engine="beam")
    with pytest.raises(ValueError, match="matmul must be one of exact, skinny, stream, auto, got 'fastest'"):
        DistillConfig(out="x", matmul="fastest")


def test_the_fast_engine_refuses_a_target_the_lean_forward_does_not_cover(tmp_path):
    model = tiny_llama(seed=3, layers=1)
    model.config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    type(model)(model.config).save_pretrained(tmp_path / "target")  # frequencies recomputed per call
    chat_tokenizer().save_pretrained(tmp_path / "target")
    with pytest.raises(ValueError, match="engine 'fast' needs a target the lean forward covers: .*dynamic.*; use "
                                         "--engine generate"):
        distill(_config(tmp_path / "out", tmp_path / "target"))
