"""Each new token's share of the decoded text, so a view can colour the text token by token.

Decoding tokens one at a time is wrong for byte-level vocabularies (a character split over two tokens decodes to
two replacement characters) and for tokenizers that join pieces with spaces. Instead the text is decoded prefix by
prefix: a token's piece is what its prefix added to the previous one; a prefix that ends inside a character (a
trailing U+FFFD) adds nothing yet, and the token that completes the character carries it.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


def token_pieces(tokenizer: Any, tokens: list[int]) -> list[str]:
    """(len(tokens),) strings whose concatenation is ``tokenizer.decode(tokens)`` (special tokens kept).

    Where a longer prefix rewrites earlier text (a decode that is not prefix-stable), each token's own decode is used
    when those join to the text, else the whole text is the last token's piece."""
    pieces, shown = [], ""
    for i in range(1, len(tokens) + 1):
        text = tokenizer.decode(list(tokens[:i]))
        if i < len(tokens) and text.endswith(REPLACEMENT):
            pieces.append("")
            continue
        if not text.startswith(shown):
            return _fallback(tokenizer, tokens)
        pieces.append(text[len(shown):])
        shown = text
    return pieces


def _fallback(tokenizer: Any, tokens: list[int]) -> list[str]:
    text = tokenizer.decode(list(tokens))
    single = [tokenizer.decode([token]) for token in tokens]
    return single if "".join(single) == text else [""] * (len(tokens) - 1) + [text]
