"""The model-card measurements run end to end on tiny random models."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specfamily.recipes.card import collapsed, main, markdown, pooled_rate, unigram_loss
from specfamily.recipes.models import llama_config
from specfamily.recipes.prompt_sets import PromptSetConfig, build_prompt_sets


def test_unigram_loss_is_add_one_smoothed():
    train, labels = np.array([1, 1, 1, 2]), np.array([1, 0])
    counts = np.array([0, 3, 1]) + 1.0
    expected = -(math.log(counts[1] / counts.sum()) + math.log(counts[0] / counts.sum())) / 2
    assert unigram_loss(train, labels, vocab_size=3) == pytest.approx(expected)


def test_pooled_rate_and_its_standard_error_over_items():
    rate, se = pooled_rate([1, 3], [2, 4])  # residuals h - r c: -1/3 and 1/3
    assert rate == pytest.approx(4 / 6) and se == pytest.approx(math.sqrt((2 / 9) / 2) / 3)
    assert pooled_rate([2, 3], [4, 4])[1] == pytest.approx(0.125)  # equal counts: stdev(0.5, 0.75) / sqrt(2)
    assert pooled_rate([3], [4]) == (0.75, 0.0)
    assert pooled_rate([], []) == (0.0, 0.0)


def test_collapse_means_one_line_three_times_in_a_row():
    assert collapsed("a = 1\nx += 1\nx += 1\n\nx += 1\n")
    assert not collapsed("x += 1\nx += 1\ny\nx += 1\n")
    assert not collapsed("\n\n\n\n") and not collapsed("")


@pytest.fixture(scope="module")
def tiny_models(prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(prepared / "tokenizer"))
    for seed, name in enumerate(("target", "draft")):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = LlamaForCausalLM(llama_config("tiny", len(tokenizer)))
        model.save_pretrained(str(root / name))
        tokenizer.save_pretrained(str(root / name))
    cfg = PromptSetConfig(complete_count=4, complete_context=64, complete_reference=16, continue_count=4,
                          continue_context=32, continue_reference=8)
    build_prompt_sets(prepared, root / "prompts", cfg)
    return root


def test_card_end_to_end(prepared, tiny_models, capsys):
    root = tiny_models
    out = root / "measurements.json"
    args = ["--workdir", str(prepared), "--target", str(root / "target"), "--draft", str(root / "draft"),
            "--prompts", str(root / "prompts"), "--out", str(out), "--threads", str(torch.get_num_threads()),
            "--seq-len", "32", "--windows", "3", "--agreement-prompts", "2", "--agreement-tokens", "4",
            "--context", "20", "--max-n", "3", "--repeats", "2", "--samples", "1", "--sample-tokens", "4",
            "--collapse-prompts", "2", "--collapse-tokens", "6"]
    result = main(args)
    saved = json.loads(out.read_text())
    assert saved["heldout_tokens"] == 3 * 32 and set(saved["verify_cost"]) == {"2", "3"}
    for key in ("target", "draft"):
        assert math.isfinite(saved[key]["heldout_loss"]) and saved[key]["t1_ms"] > 0 and saved[key]["parameters"] > 0
    assert 0 <= saved["agreement_teacher_forced"] <= 1 and 0 <= saved["agreement_greedy"] <= 1
    assert "standard error" in markdown(result)
    assert 0 <= saved["collapse_fraction"] <= 1 and len(saved["samples"]) == 1
    # a random model is about as good as uniform, worse than the unigram fit
    assert result.unigram_loss < result.target.heldout_loss < math.log(300) + 1
    assert "| t(n)/t(1) |" in capsys.readouterr().out
    assert markdown(result).count("```python") == 2
