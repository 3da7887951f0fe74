"""The rest drafter (REST): suffix array, datastore on disk, retrieval, frequent-prefix trees, greedy, lossless."""

import numpy as np
import pytest
import torch

import specfamily as sf
from specfamily.core.plugins import get_registry
from specfamily.drafters.rest.config import RestConfig
from specfamily.drafters.rest.datastore import SEPARATOR, Datastore, build_datastore, suffix_array
from specfamily.drafters.rest.drafter import RestDrafter
from specfamily.drafters.rest.retrieve import continuations, frequent_tree
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, tiny_target
from specfamily.testing.conformance import PROMPT


def test_suffix_array_equals_sorting_the_suffixes():
    rng = np.random.default_rng(0)
    data = rng.integers(-1, 4, size=300)
    expected = sorted(range(len(data)), key=lambda i: data[i:].tolist())
    assert suffix_array(data).tolist() == expected
    assert suffix_array(np.array([2, 2, 2, 2])).tolist() == [3, 2, 1, 0]  # a suffix that ends first sorts first


def test_datastore_round_trips_memory_mapped_and_finds_every_occurrence(tmp_path):
    store = Datastore.open(build_datastore([[1, 2, 3, 1, 2, 4], [5, 1, 2, 3]], tmp_path / "ds", 8, progress=False))
    assert isinstance(store.tokens, np.memmap) and isinstance(store.suffixes, np.memmap)
    assert store.tokens.tolist() == [1, 2, 3, 1, 2, 4, SEPARATOR, 5, 1, 2, 3, SEPARATOR]
    assert sorted(store.occurrences([1, 2]).tolist()) == [0, 3, 8]
    assert sorted(store.occurrences([1, 2, 3]).tolist()) == [0, 8]
    assert store.occurrences([3, 1, 2, 4, 9]).tolist() == []
    span, positions = store.longest_match([7, 7, 3, 1, 2], 2, 16)
    assert span == 3 and positions.tolist() == [2]
    assert store.longest_match([7, 6], 2, 16)[0] == 0


def test_a_datastore_refuses_ids_outside_the_vocabulary_and_a_missing_folder(tmp_path):
    with pytest.raises(ValueError, match=r"sequence 1 has token ids outside \[0, 4\)"):
        build_datastore([[1, 2], [4]], tmp_path / "bad", 4, progress=False)
    with pytest.raises(FileNotFoundError, match="no REST datastore at"):
        Datastore.open(tmp_path / "none")


def test_continuations_stop_at_the_end_of_their_sequence():
    tokens = np.array([1, 2, 3, 4, SEPARATOR, 1, 2, 5, SEPARATOR, 1, 2])
    assert continuations(tokens, np.array([0, 5, 9]), 2, 3) == [[3, 4], [5], []]


def test_frequent_tree_keeps_the_most_shared_prefixes_as_a_trie():
    paths = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [5, 6], [1, 7]]
    tokens, parents = frequent_tree(paths, max_nodes=4)
    # counts: (1,) 4, (1, 2) 3, (1, 2, 3) 2, then ties at 1: (5,) is the shortest
    assert tokens == [1, 5, 2, 3] and parents == [-1, -1, 0, 2]
    assert frequent_tree([], 4) == ([], [])


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """A datastore of the kit's prompt followed by two continuations, for the tiny targets (vocabulary 8)."""
    base = list(PROMPT)
    return build_datastore([base + [1, 2, 3], base + [1, 2, 5], base + [4, 0]], tmp_path_factory.mktemp("rest"), 8,
                           progress=False)


def test_registered_and_proposes_the_frequent_continuations(tiny_store):
    assert get_registry().entry("rest").config is RestConfig
    target = tiny_target("llama")
    drafter = sf.create_drafter("rest", target, datastore=str(tiny_store), gamma=3)
    from specfamily.core.context import DecodeContext
    ctx = DecodeContext(target, torch.tensor(PROMPT), sf.SamplingConfig(), torch.Generator(), tokens=list(PROMPT))
    drafter.begin(ctx)
    draft = drafter.propose(ctx, 3)
    # after the prompt: 1 2 3, 1 2 5, 4 0 -> by level, most frequent first: 1 (2), 4; 1 2 (2), 4 0; 1 2 3, 1 2 5
    assert draft.tokens.tolist() == [1, 4, 2, 0, 3, 5]
    assert draft.parents.tolist() == [-1, -1, 0, 1, 2, 2]


def test_a_target_outside_the_zoo_needs_a_datastore():
    with pytest.raises(ValueError, match="rest needs datastore=PATH for a target outside the zoo"):
        sf.create_drafter("rest", tiny_target("llama"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_span": 0}, "min_span must be an integer >= 1, got 0"),
        ({"min_span": 4, "max_span": 3}, r"max_span \(3\) must be >= min_span \(4\)"),
        ({"max_matches": 0}, "max_matches must be an integer >= 1, got 0"),
        ({"datastore": 3}, "datastore must be a path"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        RestConfig(**options)


def test_greedy_equals_transformers(tiny_store):
    assert_greedy_equivalent(lambda t: RestDrafter(t, gamma=3, datastore=tiny_store), vocab_size=8)


@pytest.mark.parametrize("sampling", SAMPLING_MATRIX[1:2], ids=["t07-top_p09"])
def test_lossless(tiny_store, sampling):
    [fit] = assert_lossless(lambda t: RestDrafter(t, gamma=3, datastore=tiny_store), configs=[sampling], min_depth=1)
    assert fit.passed


def test_the_default_store_reads_the_zoo_corpus_training_split():
    from specfamily.drafters.rest.default_store import corpus_texts
    from specfamily.recipes.corpus import load_corpus

    train = load_corpus().train
    assert [path for path, _ in corpus_texts()] == [doc.path for doc in train]  # held-out files left out


def test_a_zoo_target_builds_its_datastore_on_first_use_atomically(tmp_path, monkeypatch):
    import specfamily.drafters.rest.datastore as datastore_module
    import specfamily.drafters.rest.default_store as default_store

    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    target = sf.load_target("zoo:code-target")
    folder = tmp_path / "rest" / "code-target"
    real = default_store.build_datastore

    def interrupted(*args, **kwargs):  # written, but stopped before the move: nothing is left at the folder
        monkeypatch.setattr(datastore_module, "_replace", lambda *a: 1 / 0)
        return real(*args, **kwargs)

    monkeypatch.setattr(default_store, "DEFAULT_MAX_TOKENS", 3000)
    monkeypatch.setattr(default_store.build_default, "__defaults__", (3000, False))
    monkeypatch.setattr(default_store, "build_datastore", interrupted)
    with pytest.raises(ZeroDivisionError):
        RestDrafter(target)
    assert list(tmp_path.joinpath("rest").iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    monkeypatch.setattr(default_store.build_default, "__defaults__", (3000, False))
    drafter = sf.create_drafter("rest", target)
    assert drafter.datastore.path == folder and (folder / "meta.json").is_file()
    assert 3000 <= len(drafter.datastore.tokens) < 3000 + 2000  # the budget, plus one end marker per file
    stamp = (folder / "tokens.npy").stat().st_mtime_ns
    again = sf.create_drafter("rest", target)  # built once: the second drafter opens it
    assert (folder / "tokens.npy").stat().st_mtime_ns == stamp and len(again.datastore.tokens) > 0
    prompt = drafter.datastore.tokens[:40].tolist()
    prompt = prompt[: prompt.index(-1)] if -1 in prompt else prompt
    plain = sf.generate(target, None, prompt, max_new_tokens=12).tokens
    result = sf.generate(target, drafter, prompt, max_new_tokens=12)
    assert result.tokens == plain
