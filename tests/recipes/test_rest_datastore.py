"""The REST datastore recipe: which text it reads, the token budget, and a datastore the drafter opens."""

import json

from specfamily.drafters.rest.datastore import Datastore, build_datastore
from specfamily.recipes.rest_datastore import corpus_texts, token_sequences


class _Ids:
    def __init__(self, ids):
        self.input_ids = ids


def _tokenizer(text, add_special_tokens=False):
    assert add_special_tokens is False
    return _Ids([ord(c) % 50 for c in text])


def test_token_sequences_stop_at_the_budget():
    sequences = list(token_sequences(iter(["abcd", "efgh", "ijkl"]), _tokenizer, max_tokens=6))
    assert [len(s) for s in sequences] == [4, 2]


def test_a_datasets_corpus_is_read_by_field_and_indexed(tmp_path):
    rows = tmp_path / "texts.jsonl"
    rows.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["hello world", "hello there"]))
    texts = list(corpus_texts("json", str(rows), "text", "train"))
    assert texts == ["hello world", "hello there"]
    store = Datastore.open(build_datastore(token_sequences(iter(texts), _tokenizer, 100), tmp_path / "ds", 50,
                                           progress=False))
    hello = _tokenizer("hello ").input_ids
    assert len(store.occurrences(hello)) == 2


def test_the_default_text_is_the_zoo_corpus_training_split():
    from specfamily.recipes.corpus import load_corpus

    first = next(corpus_texts(None, None, "text", "train"))
    assert first == load_corpus().train[0].text
