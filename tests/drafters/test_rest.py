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
    assert continuations(tokens, np.array([0, 5]), 1, 3, stop={3}) == [[2, 3], [2, 5]]  # cut just after a stop


def test_frequent_tree_keeps_the_most_shared_prefixes_as_a_trie():
    paths = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [5, 6], [1, 7]]
    tokens, parents = frequent_tree(paths, max_nodes=4)
    # counts: (1,) 4, (1, 2) 3, (1, 2, 3) 2, then ties at 1: (5,) is the shortest
    assert tokens == [1, 5, 2, 3] and parents == [-1, -1, 0, 2]
    assert frequent_tree([], 4) == ([], []) and frequent_tree([[], []], 4) == ([], [])


def _frequent_tree_by_counting(paths, max_nodes):
    """The definition, spelled out: count every prefix, keep the best by (count, shorter, smaller tokens)."""
    from collections import Counter

    counts = Counter(tuple(path[:depth]) for path in paths for depth in range(1, len(path) + 1))
    chosen = sorted(counts.items(), key=lambda item: (-item[1], len(item[0]), item[0]))[:max_nodes]
    chosen.sort(key=lambda item: (len(item[0]), -item[1], item[0]))
    index, tokens, parents = {}, [], []
    for prefix, _ in chosen:
        index[prefix] = len(tokens)
        tokens.append(prefix[-1])
        parents.append(index[prefix[:-1]] if len(prefix) > 1 else -1)
    return tokens, parents


@pytest.mark.parametrize("seed", range(6))
def test_frequent_tree_equals_counting_every_prefix(seed):
    rng = np.random.default_rng(seed)
    vocab = [3, 5, 40][seed % 3]  # few tokens: many ties and shared prefixes; many: few
    paths = [rng.integers(0, vocab, size=rng.integers(0, 11)).tolist() for _ in range(rng.integers(1, 300))]
    for max_nodes in (1, 4, 8, 64):
        assert frequent_tree(paths, max_nodes) == _frequent_tree_by_counting(paths, max_nodes)


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


def test_a_token_file_round_trips_in_two_bytes_a_token_when_the_ids_fit(tmp_path):
    from safetensors.numpy import load_file

    from specfamily.drafters.rest.token_file import read_token_file, token_file_source, write_token_file

    sequences = [[1, 2, 3], [], [65535, 0]]
    path = write_token_file(sequences, tmp_path / "t.safetensors", source="answers")
    assert read_token_file(path) == sequences and token_file_source(path) == "answers"
    assert load_file(str(path))["tokens"].dtype == np.uint16
    wide = write_token_file([[70000, 1]], tmp_path / "w.safetensors", source="")
    assert read_token_file(wide) == [[70000, 1]] and load_file(str(wide))["tokens"].dtype == np.int32
    with pytest.raises(ValueError, match="token ids must be >= 0"):
        write_token_file([[-1]], tmp_path / "n.safetensors", source="")


def test_no_zoo_target_ships_chat_text_today():
    from specfamily.drafters.rest.default_store import shipped_tokens

    assert shipped_tokens("smollm2") is None and shipped_tokens("code-target") is None  # variants.md: did not pay


def test_a_zoo_target_with_shipped_chat_text_builds_its_datastore_from_it(tmp_path, monkeypatch):
    import specfamily.drafters.rest.default_store as default_store
    from specfamily.drafters.rest.drafter import corpus_datastore, default_datastore
    from specfamily.drafters.rest.token_file import file_digest, write_token_file

    monkeypatch.setenv("SPECFAMILY_CACHE", str(tmp_path))
    target = sf.load_target("zoo:code-target")
    prompt = [5, 6, 7, 8, 9, 10]
    answer = sf.generate(target, None, prompt, max_new_tokens=12).tokens
    shipped = write_token_file([prompt + answer, [11, 12, 13]], tmp_path / "chat.safetensors", source="answers")
    monkeypatch.setattr(default_store, "shipped_tokens", lambda name: shipped if name == "code-target" else None)
    folder = tmp_path / "rest" / f"code-target-chat-{file_digest(shipped)[:12]}"
    assert default_datastore(target) == folder and corpus_datastore(target) == tmp_path / "rest" / "code-target"
    drafter = sf.create_drafter("rest", target)
    assert drafter.datastore.path == folder and not corpus_datastore(target).exists()
    assert drafter.datastore.tokens.tolist() == [*prompt, *answer, SEPARATOR, 11, 12, 13, SEPARATOR]
    result = sf.generate(target, drafter, prompt, max_new_tokens=12)
    assert result.tokens == answer
    assert sum(len(accepted) for accepted in result.trace.accepted) >= min(6, len(answer) - 1)  # drafted from it
