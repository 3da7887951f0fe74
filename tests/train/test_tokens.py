import json

import numpy as np
import pytest
import torch

from specfamily.testing import tiny_model
from specfamily.train.tokens import (
    dataset_tokens,
    fixed_windows,
    greedy_windows,
    random_windows,
    split_heldout,
    token_array,
    zoo_tokens,
)


def test_text_datasets_from_local_jsonl(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[eos]": 0, **{w: i + 1 for i, w in enumerate("def return x y if else".split())}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[eos]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw)
    rows = [{"text": "def x return y"}, {"text": ""}, {"text": "if x else y"}, {"text": "return x"}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = split_heldout(dataset_tokens(str(tmp_path / "d.jsonl"), tokenizer, eos_token_id=0), 0.23)
    assert data.train.tolist() == [1, 3, 2, 4, 0, 5, 3, 6, 4, 0]  # the empty row is dropped
    assert data.heldout.tolist() == [2, 3, 0]
    with pytest.raises(ValueError, match=r"has no field 'code' \(fields: text\)"):
        dataset_tokens(str(tmp_path / "d.jsonl"), tokenizer, 0, text_field="code")


class CharTokenizer:
    """A stand-in tokenizer: one id per character (ord % 32)."""

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) % 32 for c in text] for text in texts]}


def test_dataset_source_joins_documents_with_eos(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"body": text}) for text in ["ab", "c", "de"]) + "\n")
    tokens = dataset_tokens("json", CharTokenizer(), 0, text_field="body", data_files=[str(path)])
    assert tokens.tolist() == [1, 2, 0, 3, 0, 4, 5, 0]
    with pytest.raises(ValueError, match="dataset 'json' has no field 'text' \\(fields: body\\)"):
        dataset_tokens("json", CharTokenizer(), 0, data_files=[str(path)])


def test_windows_have_length_plus_one_tokens_and_fixed_ones_do_not_overlap():
    tokens = np.arange(100, dtype=np.uint16)
    fixed = fixed_windows(tokens, 3, 9)
    assert fixed.shape == (3, 10) and fixed.dtype == torch.long
    assert fixed[:, 0].tolist() == [0, 40, 90]  # evenly spread over the 10 available slots
    rows = random_windows(tokens, 4, 9, torch.Generator().manual_seed(0))
    assert rows.shape == (4, 10) and all((row.diff() == 1).all() for row in rows)
    with pytest.raises(ValueError, match="too short for windows of 101"):
        random_windows(tokens, 1, 100, torch.Generator())


def test_token_arrays_and_heldout_split(tmp_path):
    np.save(tmp_path / "train.npy", np.arange(50, dtype=np.uint16))
    with pytest.raises(FileNotFoundError, match="run `specfamily-zoo prepare` first"):
        zoo_tokens(tmp_path)
    np.save(tmp_path / "heldout.npy", np.arange(5, dtype=np.uint16))
    data = zoo_tokens(tmp_path)
    assert (len(data.train), len(data.heldout)) == (50, 5)
    np.save(tmp_path / "bad.npy", np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="expected a 1-D integer token array"):
        token_array(tmp_path / "bad.npy")
    split = split_heldout(np.arange(10), 0.2)
    assert split.heldout.tolist() == [8, 9]
    with pytest.raises(ValueError, match="too short to hold out"):
        split_heldout(np.arange(1), 0.1)


def test_greedy_windows_decode_past_end_of_text_without_forcing_length():
    """The tail is the model's argmax chain, end-of-text included; the model's generation config is restored."""
    model = tiny_model("llama", vocab_size=8, dtype=torch.float32)
    windows = torch.randint(0, 8, (2, 14), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = model(input_ids=windows[:1, :4]).logits[0, -1].argmax().item()
    model.generation_config.eos_token_id = first  # the first generated token of row 0 is end-of-text
    out = greedy_windows(model, windows, 4)
    assert out.shape == (2, 14) and torch.equal(out[:, :4], windows[:, :4]) and out[0, 4] == first
    for row in out:
        for t in range(4, 14):
            with torch.no_grad():
                assert row[t] == model(input_ids=row[None, :t]).logits[0, -1].argmax()
    assert model.generation_config.eos_token_id == first
    with pytest.raises(ValueError, match=r"distillation prompt length must be in \(0, 14\), got 14"):
        greedy_windows(model, windows, 14)
