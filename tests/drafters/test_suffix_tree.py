"""The suffix drafter's reference trie (kept to check the suffix index against), speculation trees, the global cache."""

import json
import random
from collections import Counter

import pytest
import torch

from specfamily.drafters.suffix.cache import FORMAT, GlobalCache, read_sequences
from specfamily.drafters.suffix.speculate import Limits, Speculation, best_match, better, grow, spec_limit
from specfamily.drafters.suffix.tree import NONE, ROOT, Cursor, Matcher, SuffixTrie

# --- brute force ---------------------------------------------------------------------------------


def _substring_counts(sequences, max_depth):
    counts = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for n in range(1, min(max_depth, len(seq) - i) + 1):
                counts[tuple(seq[i : i + n])] += 1
    return counts


def _trie_counts(trie):
    counts, stack = {}, [ROOT]
    while stack:
        node = stack.pop()
        for child in trie.children(node):
            counts[tuple(trie.string(child))] = trie.count[child]
            stack.append(child)
    return counts


def _index_counts(index):
    counts, stack = {}, [(0, ())]
    while stack:
        node, string = stack.pop()
        for child in index.children(node):
            counts[(*string, index.token_of(child))] = index.count_of(child)
            stack.append((child, (*string, index.token_of(child))))
    return counts


def _longest_present(context, strings, max_depth):
    for n in range(min(len(context), max_depth), 0, -1):
        if tuple(context[-n:]) in strings:
            return n
    return 0


def _longest_continued(seq, max_depth):
    """Longest suffix (<= max_depth - 1 tokens) of seq that occurs earlier with a token after it."""
    for n in range(min(len(seq), max_depth - 1), 0, -1):
        suffix = seq[-n:]
        if any(seq[i : i + n] == suffix for i in range(len(seq) - n)):
            return n
    return 0


def _random_sequences(seed, count=3, length=60):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 6])
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, length))] for _ in range(count)]


# --- the trie ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_counts_and_links_equal_a_brute_force_count(seed):
    sequences, depth = _random_sequences(seed), 2 + seed
    trie = SuffixTrie(depth)
    for seq in sequences:
        trie.insert(seq)
    assert _trie_counts(trie) == dict(_substring_counts(sequences, depth))
    assert len(trie) == len(_substring_counts(sequences, depth))
    for string in _trie_counts(trie):
        node = trie.find(string)
        assert trie.depth[node] == len(string)
        assert trie.link[node] == trie.find(string[1:])  # the suffix link drops the first token


def test_one_appended_token_costs_max_depth_node_updates_whatever_the_history():
    trie = SuffixTrie(8)
    cursor = Cursor(trie)
    rng = random.Random(0)
    costs = []
    for _ in range(3000):
        before = trie.visits
        cursor.append(rng.randrange(50))
        costs.append(trie.visits - before)
    assert costs[:9] == [1, 2, 3, 4, 5, 6, 7, 8, 8]  # one node per suffix length, up to max_depth
    assert set(costs[7:]) == {8}  # the 3000th token costs what the 8th did


@pytest.mark.parametrize("seed", range(4))
def test_remove_leaves_the_trie_of_the_others_and_reuses_ids(seed):
    sequences = _random_sequences(seed + 10)
    trie = SuffixTrie(5)
    for seq in sequences:
        trie.insert(seq)
    trie.remove(sequences[0])
    assert _trie_counts(trie) == dict(_substring_counts(sequences[1:], 5))
    allocated = len(trie.count)
    trie.insert(sequences[0])  # the freed ids are reused first
    assert _trie_counts(trie) == dict(_substring_counts(sequences, 5))
    assert len(trie.count) == allocated
    for seq in sequences:
        trie.remove(seq)
    assert len(trie) == 0 and trie.edges == {} and trie.first[ROOT] == NONE


def test_remove_of_a_sequence_never_inserted_is_refused():
    trie = SuffixTrie(4)
    trie.insert([1, 2])
    with pytest.raises(ValueError, match="not inserted"):
        trie.remove([3])


@pytest.mark.parametrize("seed", range(4))
def test_matcher_tracks_the_longest_suffix_the_trie_holds(seed):
    rng = random.Random(seed)
    sequences = _random_sequences(seed + 20)
    trie = SuffixTrie(6)
    for seq in sequences:
        trie.insert(seq)
    strings = set(_trie_counts(trie))
    matcher, context = Matcher(trie), []
    for _ in range(200):
        token = rng.randrange(6)
        context.append(token)
        matcher.append(token)
        assert trie.depth[matcher.node] == _longest_present(context, strings, 6)
        continued = matcher.longest_with_continuation()
        assert continued == ROOT or trie.has_children(continued)
        assert trie.string(continued) == (context[-trie.depth[continued] :] if continued != ROOT else [])


@pytest.mark.parametrize("seed", range(4))
def test_cursor_finds_the_longest_suffix_seen_before_with_a_continuation(seed):
    seq = _random_sequences(seed + 30, count=1, length=150)[0]
    trie = SuffixTrie(7)
    cursor = Cursor(trie)
    for n, token in enumerate(seq, start=1):
        cursor.append(token)
        node = cursor.longest_with_continuation()
        assert trie.depth[node] == _longest_continued(seq[:n], 7)


def test_bad_depth_is_refused():
    with pytest.raises(ValueError, match=r"max_depth must be an integer in \[2, 255\], got 1"):
        SuffixTrie(1)


# --- speculation trees ---------------------------------------------------------------------------

REPEATS = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]  # "1 2" was followed by 3 twice and by 4 once


def _request_trie(tokens, depth=16):
    trie = SuffixTrie(depth)
    cursor = Cursor(trie)
    cursor.extend(tokens)
    return trie, cursor.longest_with_continuation()


def test_speculation_follows_frequencies_and_the_match_length():
    trie, node = _request_trie(REPEATS)
    assert trie.string(node) == [1, 2]
    limit = spec_limit(2, 1.0, 0.0, 16)
    assert limit == 2
    spec = grow(trie, node, limit, depth=8, min_prob=0.1)
    # "1 2" occurs 4 times (the last with nothing after it yet): 3 (p 2/4); then "1 2 3" -> 1 (1/2 * 2/2) beats 4 (1/4)
    assert (spec.tokens, spec.parents) == ([3, 1], [-1, 0])
    assert spec.probs == pytest.approx([0.5, 0.5])
    wide = grow(trie, node, 3, depth=1, min_prob=0.1)  # depth 1: only the root's children
    assert (wide.tokens, wide.parents) == ([3, 4], [-1, -1])
    assert wide.score == pytest.approx(0.75)


def test_min_token_prob_and_stop_tokens_prune_the_tree():
    trie, node = _request_trie(REPEATS)
    assert grow(trie, node, 8, depth=1, min_prob=0.5).tokens == [3]  # 4 has 1/4
    stopped = grow(trie, node, 8, depth=4, min_prob=0.1, stop=frozenset({3}))
    assert (stopped.tokens, stopped.parents) == ([3, 4, 1, 2], [-1, -1, 1, 2])  # nothing below 3; "4 1 2" below 4
    assert grow(trie, node, 8, depth=4, min_prob=0.1, chain=True).parents == [-1, 0, 1, 2]


def test_no_match_or_no_room_proposes_nothing():
    trie, node = _request_trie([1, 2, 3, 4])
    assert node == ROOT and len(grow(trie, node, 8, 8, 0.1)) == 0
    assert spec_limit(0, 1.0, 4.0, 16) == 0
    assert spec_limit(5, 1.0, 0.0, 3) == 3 and spec_limit(5, 0.5, 1.0, 16) == 3 and spec_limit(2, 0.1, -1, 9) == 0
    trie, node = _request_trie(REPEATS)
    assert len(grow(trie, node, 0, 8, 0.1)) == 0 and len(grow(trie, node, 8, 0, 0.1)) == 0


@pytest.mark.parametrize("seed", range(5))
def test_speculation_trees_are_tries_of_seen_continuations(seed):
    seq = _random_sequences(seed + 40, count=1, length=200)[0]
    trie, node = _request_trie(seq, depth=10)
    spec = grow(trie, node, 12, depth=5, min_prob=0.05)
    match = trie.string(node)
    seen = set()
    for i, (token, parent) in enumerate(zip(spec.tokens, spec.parents, strict=True)):
        assert -1 <= parent < i
        assert (parent, token) not in seen  # siblings carry distinct tokens
        seen.add((parent, token))
        path = [token]
        while parent >= 0:
            path.append(spec.tokens[parent])
            parent = spec.parents[parent]
        assert len(path) <= 5 and trie.find(match + path[::-1]) != NONE  # every path continues the match in the trie
    assert spec.probs == sorted(spec.probs, reverse=True)  # grown most probable first
    assert all(p >= 0.05 for p in spec.probs)


@pytest.mark.parametrize("seed", range(4))
def test_best_match_is_the_best_scored_tree_over_every_matched_length(seed):
    seq = _random_sequences(seed + 60, count=1, length=120)[0]
    trie = SuffixTrie(8)
    cursor = Cursor(trie)
    cursor.extend(seq)
    limits = Limits(max_spec_factor=1.0, max_spec_offset=1.0, max_tree_size=6, min_token_prob=0.05)
    best = best_match(trie, cursor.suffixes(), 4, limits)
    each = [grow(trie, n, spec_limit(trie.depth[n], 1.0, 1.0, 6), 4, 0.05) for n in cursor.suffixes()]
    top = max((s.score for s in each if s.tokens), default=0.0)
    assert best.score == top
    if best.tokens:  # a tie goes to the longest match
        assert best.match_length == max(s.match_length for s in each if s.tokens and s.score == top)


def test_better_takes_the_higher_score_and_the_first_on_a_tie():
    a, b = Speculation([1], [-1], [0.5]), Speculation([2, 3], [-1, 0], [0.4, 0.3])
    assert better(a, b) is b and better(b, a) is b
    assert better(a, Speculation([4], [-1], [0.5])) is a


def test_better_by_match_length_or_own_first():
    own = Speculation([1], [-1], [0.5], match_length=3)
    cached = Speculation([2, 3], [-1, 0], [0.9, 0.8], match_length=2)
    empty = Speculation()
    assert better(own, cached, "score") is cached
    assert better(own, cached, "match") is own and better(cached, own, "match") is own  # the longer match
    assert better(own, Speculation([4, 5], [-1, 0], [0.9, 0.9], match_length=3), "match").tokens == [4, 5]  # score
    assert better(own, cached, "own") is own and better(empty, cached, "own") is cached
    assert better(empty, cached, "match") is cached


# --- the global cache ----------------------------------------------------------------------------


def test_budget_evicts_the_oldest_requests():
    cache = GlobalCache(max_depth=4, max_tokens=10)
    cache.add([1, 2, 3, 4])
    cache.add([5, 6, 7])
    cache.add([8, 9, 1])  # 10 tokens: all kept
    assert list(cache.sequences) == [[1, 2, 3, 4], [5, 6, 7], [8, 9, 1]] and cache.tokens == 10
    cache.add([2, 2])  # 12 > 10: the oldest goes
    assert list(cache.sequences) == [[5, 6, 7], [8, 9, 1], [2, 2]] and cache.tokens == 8
    assert _index_counts(cache.index) == dict(_substring_counts(cache.sequences, 4))
    cache.add(list(range(20, 35)))  # longer than the budget: its last 10 tokens, alone
    assert list(cache.sequences) == [list(range(25, 35))] and cache.tokens == 10
    assert _index_counts(cache.index) == dict(_substring_counts(cache.sequences, 4))
    off = GlobalCache(max_depth=4, max_tokens=0)
    off.add([1, 2])
    assert off.tokens == 0 and len(off.index) == 0


@pytest.mark.parametrize("name", ["cache.json", "cache.safetensors"])
def test_save_and_load_round_trip(tmp_path, name):
    cache = GlobalCache(max_depth=5, max_tokens=100)
    for seq in _random_sequences(50):
        cache.add(seq)
    path = cache.save(tmp_path / name)
    assert [p.name for p in tmp_path.iterdir()] == [name]  # written under a temporary name, then renamed
    loaded = GlobalCache(max_depth=5, max_tokens=100)
    assert loaded.load(path) == len(cache.sequences)
    assert list(loaded.sequences) == list(cache.sequences)
    assert _index_counts(loaded.index) == _index_counts(cache.index)


def _write_safetensors(path, tokens, lengths, metadata=None):
    from safetensors.torch import save_file

    metadata = {"format": FORMAT, "version": "1"} if metadata is None else metadata
    save_file({"tokens": tokens, "lengths": lengths}, str(path), metadata=metadata)


@pytest.mark.parametrize(
    ("name", "write", "message"),
    [
        ("bad.json", lambda p: p.write_text("{not json"), "not JSON"),
        ("bad.json", lambda p: p.write_text(json.dumps({"sequences": [[1]]})), "not a specfamily-suffix-cache"),
        ("bad.json", lambda p: p.write_text(json.dumps({"format": FORMAT, "version": 2, "sequences": []})),
         "version 2, expected 1"),
        ("bad.json", lambda p: p.write_text(json.dumps({"format": FORMAT, "version": 1, "sequences": [[1, -2]]})),
         r"sequence 0\[1\] must be a token id"),
        ("bad.json", lambda p: p.write_text(json.dumps({"format": FORMAT, "version": 1, "sequences": [3]})),
         "must be a list of lists"),
        ("bad.safetensors", lambda p: p.write_bytes(b"\x00garbage bytes"), "not a safetensors file"),
        ("bad.safetensors", lambda p: _write_safetensors(p, torch.ones(3, dtype=torch.int64),
                                                          torch.tensor([2], dtype=torch.int64)), "lengths sum to 2"),
        ("bad.safetensors", lambda p: _write_safetensors(p, torch.ones(3, dtype=torch.int64),
                                                          torch.tensor([3], dtype=torch.int64), {}), "metadata"),
        ("bad.safetensors", lambda p: _write_safetensors(p, torch.ones(3, dtype=torch.float32),
                                                          torch.tensor([3], dtype=torch.int64)), "1-d int64"),
    ],
)
def test_corrupted_files_are_refused(tmp_path, name, write, message):
    path = tmp_path / name
    write(path)
    with pytest.raises(ValueError, match=message):
        read_sequences(path)
    cache = GlobalCache(max_depth=4)
    with pytest.raises(ValueError, match=f"suffix cache {path}"):
        cache.load(path)
    assert cache.tokens == 0


def test_missing_file_and_foreign_tokens_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_sequences(tmp_path / "none.json")
    cache = GlobalCache(max_depth=4)
    cache.add([1, 2, 70])
    path = cache.save(tmp_path / "c.json")
    with pytest.raises(ValueError, match="sequence 0 holds token 70, outside the target's vocabulary of 64"):
        GlobalCache(max_depth=4).load(path, vocab_size=64)


def test_a_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    cache = GlobalCache(max_depth=4)
    cache.add([1, 2, 3])
    path = cache.save(tmp_path / "c.json")
    cache.add([4, 5])
    monkeypatch.setattr(json, "dumps", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        cache.save(path)
    assert read_sequences(path) == [[1, 2, 3]]
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]
