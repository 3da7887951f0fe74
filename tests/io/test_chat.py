"""Chat prompts from user turns and the model's own answers (no model: the tokenizer's chat template only)."""

from __future__ import annotations

import pytest
from eval_helpers import chat_tokenizer, tiny_tokenizer

from specfamily.io.chat import answer_text, chat_messages, chat_prompt_ids, turn_id


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_turn_ids():
    assert [turn_id("81", t) for t in (1, 2, 3)] == ["81", "81:turn2", "81:turn3"]
    with pytest.raises(ValueError, match="turns count from 1"):
        turn_id("81", 0)


def test_messages_interleave_answers_after_an_optional_system_prompt():
    assert chat_messages(["hi"]) == [{"role": "user", "content": "hi"}]
    assert chat_messages(["a", "b"], ["A"], system_prompt="be brief") == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": "A"}, {"role": "user", "content": "b"},
    ]
    with pytest.raises(ValueError, match=r"2 user turn\(s\) need 1 answer\(s\), got 0"):
        chat_messages(["a", "b"])
    with pytest.raises(ValueError, match="at least one user turn"):
        chat_messages([])


def test_turn_one_is_the_user_turn_with_a_generation_prompt(tokenizer):
    ids = chat_prompt_ids(tokenizer, ["Write a line."])
    assert ids == _ids(tokenizer, "<|user|>Write a line.<|end|>\n<|assistant|>")


def test_turn_two_holds_the_first_answer_as_the_assistant_message(tokenizer):
    ids = chat_prompt_ids(tokenizer, ["Write a line.", "Now shorter."], ["A line."], system_prompt="sys")
    expected = "<|system|>sys<|end|>\n<|user|>Write a line.<|end|>\n<|assistant|>A line.<|end|>\n" \
               "<|user|>Now shorter.<|end|>\n<|assistant|>"
    assert ids == _ids(tokenizer, expected)


def test_a_tokenizer_without_a_chat_template_is_refused():
    with pytest.raises(ValueError, match="the target's tokenizer has none"):
        chat_prompt_ids(tiny_tokenizer(), ["hi"])


def test_answer_text_drops_the_ending_eos_and_outer_space(tokenizer):
    tokens = _ids(tokenizer, "  two words \n") + [tokenizer.eos_token_id]
    assert answer_text(tokenizer, tokens) == "two words"
