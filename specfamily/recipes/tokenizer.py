"""Byte-level BPE tokenizer for the zoo, trained with ``tokenizers``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"  # id 0: EOS and pad


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if tokenizer.token_to_id(END_OF_TEXT) != 0:
        raise RuntimeError("end-of-text token must have id 0")
    return tokenizer


def wrap(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers tokenizer with end-of-text as EOS and pad."""
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT, pad_token=END_OF_TEXT)


def save_tokenizer(tokenizer: Tokenizer, folder: Path) -> PreTrainedTokenizerFast:
    fast = wrap(tokenizer)
    fast.save_pretrained(str(folder))
    return fast
