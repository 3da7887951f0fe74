"""The fast answer engine: the same greedy answers as generate(), features of the same pass, rows leaving the batch."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specfamily.recipes.distill import Teacher, generate_answers
from specfamily.recipes.fast_answers import SlotCache, fast_answers, left_pad
from specfamily.runtime.kernel import stream_kernel
from specfamily.runtime.lean import LeanLlama
from specfamily.runtime.matmul import linear_for
from specfamily.testing.tiny import single_thread

VOCAB = 97
ANSWER_TOKENS = 12


@pytest.fixture(scope="module")
def gqa_model() -> LlamaForCausalLM:
    """Two key/value heads for four query heads (grouped attention: the packed single-query branch)."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(11)
        model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return model


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (4, 9, 1, 15, 7, 12)]


def _generate(model, prompts: list[list[int]], eos: int) -> list[tuple[list[int], torch.Tensor]]:
    teacher = Teacher(model, None, eos, torch.empty(1, 0, dtype=torch.long), None, [])
    return generate_answers(teacher, prompts, ANSWER_TOKENS)


@pytest.fixture(scope="module")
def eos_and_expected(gqa_model):
    """An end token some answers reach early and others never: the token row 0 emits third under generate()."""
    with single_thread():
        eos = _generate(gqa_model, _prompts(), eos=0)[0][0][len(_prompts()[0]) + 2]
        expected = _generate(gqa_model, _prompts(), eos)
    lengths = [len(tokens) - len(p) for (tokens, _), p in zip(expected, _prompts(), strict=True)]
    assert min(lengths) < ANSWER_TOKENS and max(lengths) == ANSWER_TOKENS, lengths  # rows leave at several steps
    return eos, expected


def _check_same(got, expected, atol: float) -> None:
    for (tokens, features), (want_tokens, want_features), prompt in zip(got, expected, _prompts(), strict=True):
        assert tokens == want_tokens
        assert features.shape == (len(tokens) - 1, 32)
        torch.testing.assert_close(features, want_features, atol=atol, rtol=atol)
        assert tokens[: len(prompt)] == prompt


def test_exact_matmul_answers_equal_generate_token_for_token(gqa_model, eos_and_expected):
    eos, expected = eos_and_expected
    with single_thread():
        got = fast_answers(LeanLlama(gqa_model, linear_for("exact")), _prompts(), eos, ANSWER_TOKENS)
    _check_same(got, expected, atol=1e-5)


def test_features_are_the_final_norm_state_of_a_full_forward(gqa_model, eos_and_expected):
    eos, _ = eos_and_expected
    with single_thread():
        got = fast_answers(LeanLlama(gqa_model), _prompts(), eos, ANSWER_TOKENS)
        for tokens, features in got:
            with torch.no_grad():
                out = gqa_model(torch.tensor([tokens]), output_hidden_states=True)
            torch.testing.assert_close(features, out.hidden_states[-1][0, :-1], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not stream_kernel().available, reason="the stream matmul kernel does not build here")
def test_stream_matmul_answers_equal_generate(gqa_model, eos_and_expected):
    eos, expected = eos_and_expected
    with single_thread():
        got = fast_answers(LeanLlama(gqa_model, linear_for("stream")), _prompts(), eos, ANSWER_TOKENS)
    _check_same(got, expected, atol=1e-4)


def test_one_answer_token_and_a_one_token_prompt(gqa_model):
    with single_thread():
        got = fast_answers(LeanLlama(gqa_model), [[5], [7, 8, 9]], eos=0, answer_tokens=1)
    with torch.no_grad():
        first = [int(gqa_model(torch.tensor([p])).logits[0, -1].argmax()) for p in ([5], [7, 8, 9])]
    assert [tokens for tokens, _ in got] == [[5, first[0]], [7, 8, 9, first[1]]]
    assert [features.shape[0] for _, features in got] == [1, 3]


def test_left_padding_is_generates():
    ids, pad = left_pad([[4, 5], [6, 7, 8, 9]], pad_id=1)
    assert ids.tolist() == [[1, 1, 4, 5], [6, 7, 8, 9]] and pad.tolist() == [2, 0]


def test_bad_calls_are_refused(gqa_model):
    lean = LeanLlama(gqa_model)
    with pytest.raises(ValueError, match="answer_tokens must be at least 1, got 0"):
        fast_answers(lean, [[1]], eos=0, answer_tokens=0)
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        fast_answers(lean, [[1], []], eos=0, answer_tokens=2)
    cache = SlotCache.empty(gqa_model, rows=1, slots=2, dtype=torch.float32)
    with pytest.raises(ValueError, match="the cache holds 2 positions; a pass would fill 3"):
        cache.update(torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 3, 8), 0)
