"""A messages column as a chat question: role/content and ShareGPT from/value, system first, alternation, errors."""

from __future__ import annotations

import pytest

from specfamily.eval.messages import ChatQuestion, chat_question, is_messages, normalise


def test_role_content_and_sharegpt_give_the_same_question():
    openai = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
              {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye."}]
    sharegpt = [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi."},
                {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Bye."}]
    expected = ChatQuestion("Be brief.", ("Hi.", "Bye."))
    assert chat_question(openai) == chat_question(sharegpt) == expected
    assert normalise(sharegpt)[2] == {"role": "assistant", "content": "Hello."}


def test_the_datasets_own_answers_are_dropped_and_max_turns_keeps_the_first():
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "B"}]
    assert chat_question(messages) == ChatQuestion(None, ("a", "b"))
    assert chat_question(messages, max_turns=1) == ChatQuestion(None, ("a",))


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([{"role": "assistant", "content": "x"}], "message 0 is a 'assistant' message where the conversation needs a "
                                                   "'user' one"),
        ([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}], "message 1 is a 'user' message"),
        ([{"role": "system", "content": "s"}], "the conversation has no user message"),
        ([{"speaker": "user", "text": "x"}], "message 0 is neither role/content nor from/value"),
        ([{"role": "narrator", "content": "x"}], "message 0 has an unknown role 'narrator'"),
    ],
)
def test_malformed_conversations_name_the_message(messages, message):
    with pytest.raises(ValueError, match=message):
        chat_question(messages)


def test_is_messages_needs_one_known_layout():
    assert is_messages([{"role": "user", "content": "x"}]) and is_messages([{"from": "human", "value": "x"}])
    assert not is_messages([]) and not is_messages("text") and not is_messages(["a", "b"])
    assert not is_messages([{"role": "user", "content": "x"}, {"from": "gpt", "value": "y"}])  # mixed layouts
