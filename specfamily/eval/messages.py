"""A dataset's ``messages`` column as a chat question: its system prompt and its user turns (pure functions).

Two layouts are read: OpenAI's role/content (``{"role": "user", "content": ...}``) and ShareGPT's from/value
(``{"from": "human", "value": ...}``). The dataset's own assistant messages are dropped: turn t is asked after the
arm's own answers to turns 1..t-1, as the runner asks Spec-Bench's second turns (:mod:`specfamily.io.chat`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ROLES = {  # every spelling either layout uses -> the chat template's role
    "system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant",
    "bot": "assistant", "model": "assistant", "chatgpt": "assistant",
}
LAYOUTS = (("role", "content"), ("from", "value"))  # role/content (OpenAI), from/value (ShareGPT)


@dataclass(frozen=True)
class ChatQuestion:
    """What a conversation asks: an optional system prompt and the user turns, in order."""

    system: str | None
    turns: tuple[str, ...]


def message_layout(message: Any) -> tuple[str, str] | None:
    """The (role key, text key) of one message, or None when it is not a message of a known layout."""
    if not isinstance(message, dict):
        return None
    for role_key, text_key in LAYOUTS:
        if isinstance(message.get(role_key), str) and isinstance(message.get(text_key), str):
            return role_key, text_key
    return None


def is_messages(value: Any) -> bool:
    """Whether ``value`` is a non-empty list of messages in one known layout (what auto-detection looks for)."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Sequence) or not value:
        return False
    layouts = {message_layout(message) for message in value}
    return len(layouts) == 1 and None not in layouts


def normalise(messages: Sequence[Any]) -> list[dict[str, str]]:
    """The messages as role/content dicts with the chat template's roles; a ValueError names a bad message."""
    normalised = []
    for position, message in enumerate(messages):
        layout = message_layout(message)
        if layout is None:
            raise ValueError(f"message {position} is neither role/content nor from/value: {message!r:.80}")
        role = ROLES.get(message[layout[0]].lower())
        if role is None:
            raise ValueError(f"message {position} has an unknown role {message[layout[0]]!r}; "
                             f"known: {', '.join(ROLES)}")
        normalised.append({"role": role, "content": message[layout[1]]})
    return normalised


def chat_question(messages: Sequence[Any], max_turns: int | None = None) -> ChatQuestion:
    """The system prompt (a leading system message) and the user turns of a conversation (at most ``max_turns``).

    After the system message the conversation alternates user, assistant, user, ...; it may end on either.
    """
    normalised = normalise(messages)
    system = None
    if normalised and normalised[0]["role"] == "system":
        system = normalised.pop(0)["content"]
    for position, message in enumerate(normalised):
        expected = "user" if position % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise ValueError(f"message {position + (system is not None)} is a {message['role']!r} message where "
                             f"the conversation needs a {expected!r} one (system first, then user and assistant "
                             "in turn)")
    turns = tuple(message["content"] for message in normalised[::2])
    if not turns:
        raise ValueError("the conversation has no user message")
    return ChatQuestion(system, turns[:max_turns])
