"""The suffix drafter's compact index (a generalized suffix automaton): the same counts, matches and speculation
trees as the bounded-depth trie it replaced, at a fraction of its memory, with a bounded cost per token."""

import random
import tracemalloc
from collections import Counter

import pytest

from specfamily.drafters.suffix.automaton import NONE, ROOT, Matcher, Sequence, SuffixIndex
from specfamily.drafters.suffix.cache import GlobalCache
from specfamily.drafters.suffix.speculate import Limits, best_match, grow
from specfamily.drafters.suffix.tree import Cursor, SuffixTrie
from specfamily.drafters.suffix.tree import Matcher as TrieMatcher


def _substring_counts(sequences, max_depth):
    counts = Counter()
    for seq in sequences:
        for i in range(len(seq)):
            for n in range(1, min(max_depth, len(seq) - i) + 1):
                counts[tuple(seq[i : i + n])] += 1
    return counts


def _index_counts(index):
    counts, stack = {}, [(ROOT, ())]
    while stack:
        node, string = stack.pop()
        for child in index.children(node):
            counts[(*string, index.token_of(child))] = index.count_of(child)
            stack.append((child, (*string, index.token_of(child))))
    return counts


def _random_sequences(rng, count, length):
    vocab = rng.choice([2, 3, 6, 20])
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, length))] for _ in range(count)], vocab


def _same(a, b):
    return (a.tokens, a.parents, a.probs, a.match_length) == (b.tokens, b.parents, b.probs, b.match_length)


@pytest.mark.parametrize("seed", range(8))
def test_counts_equal_a_brute_force_count_and_removal_takes_a_sequence_out(seed):
    rng = random.Random(seed)
    sequences, _ = _random_sequences(rng, rng.randint(2, 5), 80)
    depth = rng.choice([2, 3, 5, 64])
    index = SuffixIndex(depth)
    for seq in sequences:
        index.insert(seq)
    assert _index_counts(index) == dict(_substring_counts(sequences, depth))
    index.remove(sequences[0])
    assert _index_counts(index) == dict(_substring_counts(sequences[1:], depth))  # its strings are gone
    index.insert(sequences[0])
    assert _index_counts(index) == dict(_substring_counts(sequences, depth))
    assert index.find(sequences[-1][:depth]) != NONE and index.find(sequences[-1] + [99]) == NONE


def test_remove_of_a_sequence_never_inserted_is_refused_and_changes_nothing():
    index = SuffixIndex(4)
    index.insert([1, 2, 1])
    before = _index_counts(index)
    with pytest.raises(ValueError, match="cannot remove a sequence that was not inserted"):
        index.remove([1, 2, 3])
    with pytest.raises(ValueError, match="cannot remove a sequence that was not inserted"):
        index.remove([1, 1])
    assert _index_counts(index) == before


@pytest.mark.parametrize("seed", range(12))
def test_speculation_trees_equal_the_tries(seed):
    """Both matchers (the global one and a request's own sequence) give the trie's trees, token for token."""
    rng = random.Random(100 + seed)
    sequences, vocab = _random_sequences(rng, rng.randint(1, 4), 80)
    depth = rng.choice([3, 5, 8, 64])
    index, trie = SuffixIndex(depth), SuffixTrie(depth)
    for seq in sequences:
        index.insert(seq)
        trie.insert(seq)
    if len(sequences) > 1:  # an eviction: the removed sequence's states stay, with count 0
        index.remove(sequences[0])
        trie.remove(sequences[0])
    limits = Limits(1.0, rng.choice([0.0, 2.0]), 16, rng.choice([0.0, 0.1]), rng.random() < 0.3)
    ours, theirs = Matcher(index), TrieMatcher(trie)
    own_index, own_trie = SuffixIndex(depth), SuffixTrie(depth)
    own, cursor = Sequence(own_index), Cursor(own_trie)
    for _ in range(120):
        token = rng.randrange(vocab)
        for tracker in (ours, theirs, own, cursor):
            tracker.append(token)
        for levels in (1, 4, 100):
            trie_nodes = [n for n in theirs.suffixes() if trie.depth[n] < depth]
            assert _same(best_match(index, ours.suffix_nodes(levels), levels, limits),
                         best_match(trie, trie_nodes, levels, limits))
            assert _same(best_match(own_index, own.suffix_nodes(levels), levels, limits),
                         best_match(own_trie, cursor.suffixes(), levels, limits))


def test_one_appended_token_costs_at_most_max_depth_count_updates_whatever_the_history():
    index = SuffixIndex(8)
    sequence = Sequence(index)
    rng = random.Random(0)
    costs, states = [], []
    for _ in range(6000):
        before = index.visits
        sequence.append(rng.randrange(3))  # a small vocabulary: long repeats
        costs.append(index.visits - before)
        states.append(len(index.length))
    assert max(costs) <= 8 + 1  # the root and at most max_depth suffix states, at the 10th token as at the 6000th
    assert sum(costs[-1000:]) <= sum(costs[1000:2000]) * 1.1
    assert states[-1] <= 2 * 6000  # at most two states per token


def test_memory_per_token_is_a_fraction_of_the_tries():
    rng = random.Random(1)
    text = [rng.randrange(40) for _ in range(400)]
    sequences = [text[i : i + 300] + [rng.randrange(40) for _ in range(100)] for i in range(0, 100, 10)]
    sizes = {}
    for cls in (SuffixTrie, SuffixIndex):
        tracemalloc.start()
        structure = cls(64)
        for seq in sequences:
            structure.insert(seq)
        sizes[cls] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    assert sizes[SuffixIndex] * 10 < sizes[SuffixTrie]
    assert sizes[SuffixIndex] / (len(sequences) * 400) < 500  # bytes per token


def test_eviction_rebuilds_the_index_once_evicted_tokens_outnumber_live_ones():
    cache = GlobalCache(max_depth=6, max_tokens=50)
    rng = random.Random(2)
    peak = 0
    for _ in range(40):
        cache.add([rng.randrange(5) for _ in range(rng.randint(5, 20))])
        assert cache.tokens <= 50 and cache.evicted <= cache.tokens + 20
        assert _index_counts(cache.index) == dict(_substring_counts(cache.sequences, 6))
        peak = max(peak, len(cache.index.length))
    assert peak <= 2 * (2 * 50 + 20)  # states of at most the live tokens and as many evicted ones


def _own(tokens, depth=16):
    index = SuffixIndex(depth)
    sequence = Sequence(index)
    sequence.extend(tokens)
    return index, sequence


def test_recency_breaks_frequency_ties_and_follows_the_latest_occurrence():
    # "1" was followed by 5 (first) and by 8 (later), once each: a tie the counts cannot break
    index, sequence = _own([1, 5, 6, 7, 1, 8, 9, 3, 1])
    node = index.find([1])
    assert [index.token_of(c) for c in sorted(index.children(node), key=index.recent_of, reverse=True)] == [8, 5]
    plain = grow(index, node, 4, 4, 0.1)
    assert (plain.tokens, plain.parents) == ([5, 8, 6, 9], [-1, -1, 0, 1])  # smaller token first, breadth first
    recent = grow(index, node, 4, 4, 0.1, recency=True)
    assert (recent.tokens, recent.parents) == ([8, 9, 3, 1], [-1, 0, 1, 2])  # the latest continuation, as a chain
    assert recent.score == pytest.approx(plain.score)  # the same expected acceptance under the counts
    # a real frequency difference still wins over recency: "1 5" twice, "1 8" once (the latest)
    index, _ = _own([1, 5, 1, 5, 1, 8, 1])
    assert grow(index, index.find([1]), 1, 1, 0.1, recency=True).tokens == [5]


def test_recency_options_reach_the_speculation_through_best_match():
    index, sequence = _own([1, 5, 6, 7, 1, 8, 9, 3, 1])
    limits = Limits(max_spec_factor=1.0, max_spec_offset=3.0, max_tree_size=4, recency=True)
    spec = best_match(index, sequence.suffix_nodes(4), 4, limits)
    assert spec.tokens == [8, 9, 3, 1] and spec.match_length == 1
