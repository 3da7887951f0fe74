"""Each token's share of the decoded text (what the HTML view colours)."""

from __future__ import annotations

from eval_helpers import tiny_tokenizer

from specfamily.eval.pieces import token_pieces


def test_pieces_join_to_the_text_and_multibyte_characters_land_on_the_token_that_completes_them():
    tokenizer = tiny_tokenizer()  # byte-level BPE: "é", "—" and "日" are split over several byte tokens
    tokens = tokenizer.encode("héllo — 日 def f():\n\treturn 1")
    pieces = token_pieces(tokenizer, tokens)
    assert len(pieces) == len(tokens) and "".join(pieces) == tokenizer.decode(tokens)
    assert "\ufffd" not in "".join(pieces)
    assert "日" in pieces and "é" in pieces and "" in pieces  # whole characters; the byte tokens before them: ""


class _Rewriting:
    """A decode that is not prefix-stable: a longer prefix rewrites earlier text."""

    def decode(self, tokens):
        return "".join("A" if t == 1 else "b" for t in tokens) if len(tokens) < 3 else "X" * len(tokens)


def test_a_decode_that_rewrites_earlier_text_puts_the_whole_text_on_the_last_token():
    assert token_pieces(_Rewriting(), [1, 2, 2]) == ["", "", "XXX"]
    assert token_pieces(_Rewriting(), []) == []
