"""The zoo tokenizer: byte-level BPE, end-of-text at id 0, exact round trips."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from specfamily.recipes.tokenizer import END_OF_TEXT, save_tokenizer, train_tokenizer

TEXTS = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n", "print('héllo, wörld ✓')\n"] * 20


def test_trains_with_end_of_text_at_zero():
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    assert tokenizer.token_to_id(END_OF_TEXT) == 0
    assert 257 <= tokenizer.get_vocab_size() <= 300


def test_round_trips_any_text(tmp_path):
    fast = save_tokenizer(train_tokenizer(TEXTS, vocab_size=300), tmp_path / "tok")
    loaded = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "tok"))
    assert loaded.eos_token_id == 0 and loaded.pad_token_id == 0 and len(loaded) == len(fast)
    for text in TEXTS[:3] + ["\t  odd   spacing ,  . ;\n\n", "unseen ∑ 日本語 \x00 bytes"]:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids) == text
        assert ids == fast(text, add_special_tokens=False)["input_ids"]
