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


def _distillation(folder, conversations):
    """A distillation folder of one batch: (user turn, tokens, answer start) per conversation."""
    import torch
    from safetensors.torch import save_file

    tokens = [t for _, conv, _ in conversations for t in conv]
    lengths = [len(conv) for _, conv, _ in conversations]
    tensors = {"tokens": torch.tensor(tokens, dtype=torch.int32),
               "features": torch.zeros(len(tokens) - len(conversations), 4, dtype=torch.float16),
               "starts": torch.tensor([0, *lengths]).cumsum(0), "answer_starts": torch.tensor([a for *_, a in
                                                                                               conversations])}
    folder.mkdir()
    save_file(tensors, str(folder / "batch-00000.safetensors"),
              metadata={"user_turns": json.dumps([turn for turn, _, _ in conversations]), "config": "{}"})
    return folder


def test_a_distillation_folder_gives_its_training_conversations_whole(tmp_path):
    from specfamily.recipes.rest_datastore import distilled_sequences
    from specfamily.train.distilled import is_heldout

    heldout = next(f"turn {i}" for i in range(10_000) if is_heldout(f"turn {i}"))
    kept = [f"turn {i}" for i in range(10_000) if not is_heldout(f"turn {i}")][:2]
    folder = _distillation(tmp_path / "distill", [(kept[0], [1, 2, 3, 4], 2), (heldout, [5, 6, 7], 1),
                                                 (kept[1], [8, 9, 10], 1), (kept[0], [1, 2, 3, 4], 2)])
    assert list(distilled_sequences(folder, 100)) == [[1, 2, 3, 4], [8, 9, 10]]  # held out and repeat left out
    assert list(distilled_sequences(folder, 5)) == [[1, 2, 3, 4], [8]]  # the token budget


def test_the_recipe_writes_the_token_file_it_indexes(tmp_path, monkeypatch):
    import specfamily.recipes.rest_datastore as recipe
    from specfamily.drafters.rest.token_file import read_token_file, token_file_source

    monkeypatch.setattr(recipe, "load_target", lambda name: type("T", (), {"vocab_size": 16, "tokenizer": None})())
    from specfamily.train.distilled import is_heldout

    turn = next(f"turn {i}" for i in range(10_000) if not is_heldout(f"turn {i}"))
    folder = _distillation(tmp_path / "smollm2-distill", [(turn, [1, 2, 3, 4], 2)])
    out = recipe.main(["--distill", str(folder), "--save-tokens", str(tmp_path / "t.safetensors"),
                       "--out", str(tmp_path / "ds")])
    assert read_token_file(tmp_path / "t.safetensors") == [[1, 2, 3, 4]]
    assert token_file_source(tmp_path / "t.safetensors").startswith("distillation smollm2-distill")
    assert Datastore.open(out).tokens.tolist() == [1, 2, 3, 4, -1]
