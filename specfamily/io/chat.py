"""Chat prompts: a question's user turns and the model's own answers, through the tokenizer's chat template (pure
functions of a tokenizer). Turn t is the user's turns 1..t with the arm's own answers to turns 1..t-1, ending with a
generation prompt, as Spec-Bench asks its second turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TURN_MARK = ":turn"  # record ids: "81" for a question's first turn, "81:turn2" for its second


def turn_id(prompt_id: str, turn: int) -> str:
    """The record id of a prompt's ``turn`` (1-based): the prompt's own id for turn 1, ``<id>:turn<t>`` after."""
    if turn < 1:
        raise ValueError(f"turns count from 1, got {turn}")
    return prompt_id if turn == 1 else f"{prompt_id}{TURN_MARK}{turn}"


def chat_messages(
    user_turns: Sequence[str], answers: Sequence[str] = (), system_prompt: str | None = None
) -> list[dict[str, str]]:
    """The messages of the conversation up to the last user turn: one answer for each earlier user turn."""
    if not user_turns:
        raise ValueError("a chat prompt needs at least one user turn")
    if len(answers) != len(user_turns) - 1:
        raise ValueError(f"{len(user_turns)} user turn(s) need {len(user_turns) - 1} answer(s), got {len(answers)}")
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for user, answer in zip(user_turns, [*answers, None], strict=True):
        messages.append({"role": "user", "content": user})
        if answer is not None:
            messages.append({"role": "assistant", "content": answer})
    return messages


def chat_prompt_ids(
    tokenizer,
    user_turns: Sequence[str],
    answers: Sequence[str] = (),
    system_prompt: str | None = None,
    template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of the conversation in the tokenizer's chat template (or ``template``, a Jinja string, with
    ``template_kwargs`` as extra template variables), with the assistant's generation prompt."""
    if template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the dataset asks for the chat template but the target's tokenizer has none; "
                         "give one with dataset.chat_template=FILE or a Jinja string")
    messages = chat_messages(user_turns, answers, system_prompt)
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                         **dict(template_kwargs or {}))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def answer_text(tokenizer, tokens: Sequence[int]) -> str:
    """The assistant message a turn's new tokens make: decoded, special tokens (the ending EOS) dropped, stripped."""
    return tokenizer.decode(list(tokens), skip_special_tokens=True).strip()
