import random

import pytest
import torch

import specfamily as sf
from specfamily.core.plugins import get_registry
from specfamily.drafters.prompt_lookup.config import PromptLookupConfig, resolve_branches
from specfamily.drafters.prompt_lookup.drafter import PromptLookupDrafter
from specfamily.drafters.prompt_lookup.index import NgramIndex, build_trie
from specfamily.testing import SAMPLING_MATRIX, assert_greedy_equivalent, assert_lossless, check_fit, tiny_model
from specfamily.testing.conformance import PROMPT

TREE_PROMPT = (1, 2, 1, 3, 1)  # "1" was followed by 2 and by 3: two distinct branches on the first pass
REPEAT_PROMPT = (1, 2, 3, 1, 2, 3, 1)


# --- the index: a pure data structure ------------------------------------------------------------


def _brute_occurrences(tokens, n):
    """Continuation starts of earlier occurrences of the last n tokens, most recent first, by rescanning."""
    if len(tokens) < n:
        return []
    suffix = tokens[-n:]
    return [s for s in range(len(tokens) - 1, n - 1, -1) if tokens[s - n : s] == suffix]


def _brute_continuation(tokens, start, length, stop=()):
    seq = list(tokens)
    out = []
    for k in range(length):
        out.append(seq[start + k])
        seq.append(out[-1])
        if out[-1] in stop:
            break
    return out


def test_most_recent_match_and_what_followed():
    index = NgramIndex(1, 3, [7, 1, 2, 9, 9, 1, 2, 5, 6, 4, 1, 2])
    assert list(index.occurrences(2)) == [7, 3]
    assert index.propose(3) == [[5, 6, 4]]  # the later "1 2" (followed by 5) wins over the earlier (by 9)


def test_longer_ngram_is_preferred_over_a_more_recent_shorter_one():
    index = NgramIndex(1, 3, [3, 1, 2, 8, 1, 2, 6, 3, 1, 2])
    assert index.propose(1, branches=1) == [[8]]  # "3 1 2" -> 8, although "1 2" -> 6 is more recent
    assert index.propose(1, branches=2) == [[8], [6]] and index.matched == 3  # the best path's n


def test_a_proposal_carries_its_match_length_as_evidence():
    target = sf.testing.tiny_target("llama", vocab_size=10)
    drafter = PromptLookupDrafter(target, gamma=3)
    for tokens, evidence in (([3, 1, 2, 8, 1, 2, 6, 3, 1, 2], 3), ([4, 1, 2, 5, 1, 2], 2), ([4, 1, 5, 1], 1),
                             ([4, 5, 6], 0)):
        ctx = sf.DecodeContext(target, torch.tensor(tokens), sf.SamplingConfig(), torch.Generator(), list(tokens))
        drafter.begin(ctx)
        assert drafter.propose(ctx, 3).evidence == evidence


def test_no_match_proposes_nothing():
    assert NgramIndex(1, 3, [1, 2, 3, 4]).propose(5) == []
    assert NgramIndex(1, 3, []).propose(5) == []
    assert NgramIndex(1, 3, [4]).propose(5) == []
    assert NgramIndex(2, 3, [1, 2, 3, 1]).propose(5) == []  # only a 1-gram matches, min_ngram is 2


def test_continuation_past_the_end_copies_its_own_proposal():
    index = NgramIndex(1, 2, [5, 1, 2, 1, 2])
    assert index.propose(5) == [[1, 2, 1, 2, 1]]  # "1 2" at start 3 is followed by "1 2", then by itself
    assert NgramIndex(1, 3, [4, 4]).propose(3) == [[4, 4, 4]]


def test_stop_token_ends_a_proposal_just_after_it():
    index = NgramIndex(1, 2, [1, 2, 0, 3, 4, 1, 2])
    assert index.propose(4) == [[0, 3, 4, 1]]  # the proposal may contain EOS
    assert index.propose(4, stop={0}) == [[0]]


def test_branches_are_distinct_matches_in_preference_order():
    index = NgramIndex(1, 2, [1, 5, 1, 6, 1, 5, 2, 1])
    # "1" occurs with continuations 5.. (start 5), 6.. (start 3), 5.. (start 1): the last one is new from depth 2
    assert index.propose(3, branches=3) == [[5, 2, 1], [6, 1, 5], [5, 1, 6]]
    assert index.propose(3, branches=1) == [[5, 2, 1]]


def test_duplicate_continuations_are_not_branches():
    index = NgramIndex(1, 1, [1, 2, 1, 2, 1])
    assert index.propose(2, branches=3) == [[2, 1]]


def test_build_trie_merges_prefixes_and_keeps_sibling_order():
    tokens, parents = build_trie([[5, 2, 1], [6, 1, 5], [5, 6, 1]])
    assert tokens == [5, 2, 1, 6, 1, 5, 6, 1]
    assert parents == [-1, 0, 1, -1, 3, 4, 0, 6]
    assert build_trie([]) == ([], [])


@pytest.mark.parametrize("seed", range(6))
def test_incremental_index_equals_a_brute_force_rescan(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5])
    tokens = [rng.randrange(vocab) for _ in range(120)]
    index = NgramIndex(1, 4, tokens[:7])
    length = 7
    while length < len(tokens):
        step = rng.randint(1, 5)
        index.extend(tokens[length : length + step])
        length = min(length + step, len(tokens))
        prefix = tokens[:length]
        assert index.tokens == prefix
        for n in range(1, 5):
            assert list(index.occurrences(n)) == _brute_occurrences(prefix, n)
        expected = next((_brute_occurrences(prefix, n) for n in (4, 3, 2, 1) if _brute_occurrences(prefix, n)), [])
        stop = {0} if seed % 2 else set()
        want = [_brute_continuation(prefix, expected[0], 6, stop)] if expected else []
        assert index.propose(6, stop=stop) == want


def test_index_options_are_checked():
    with pytest.raises(ValueError, match="min_ngram must be an integer >= 1, got 0"):
        NgramIndex(0, 3)
    with pytest.raises(ValueError, match=r"max_ngram must be an integer >= min_ngram \(2\), got 1"):
        NgramIndex(2, 1)
    with pytest.raises(ValueError, match=r"n must be in \[1, 3\], got 4"):
        list(NgramIndex(1, 3, [1, 2]).occurrences(4))


# --- the drafter --------------------------------------------------------------------------------


class _Recording(PromptLookupDrafter):
    """Counts the drafts it proposes, and those that are trees; keeps the draft sizes in order."""

    drafts = 0
    trees = 0
    sizes: list[int]

    def propose(self, ctx, gamma):
        draft = super().propose(ctx, gamma)
        type(self).sizes.append(len(draft))
        if len(draft):
            type(self).drafts += 1
            type(self).trees += not draft.is_chain
        return draft


def _recording(**options):
    """A recording drafter class and its factory; a constant gamma (10) unless given, so every pass drafts."""
    class Recording(_Recording):
        sizes = []

    options.setdefault("gamma", PromptLookupDrafter.default_gamma)
    return Recording, (lambda target: Recording(target, **options))


def _assert_fit(factory, sampling, prompt):
    fit = check_fit(factory, sampling, prompt=prompt)
    assert fit.impossible == 0 and fit.p_value >= 1e-3, fit
    return fit


def test_registered_with_its_config():
    entry = get_registry().entry("prompt_lookup")
    assert entry.config is PromptLookupConfig
    target = sf.testing.tiny_target("llama", vocab_size=16)
    drafter = sf.create_drafter("prompt_lookup", target, gamma=5, max_ngram=4, branches=2)
    assert isinstance(drafter, PromptLookupDrafter)
    assert drafter.policy.next_gamma() == 5
    assert (drafter.config.min_ngram, drafter.config.max_ngram, drafter.config.branches) == (1, 4, 2)
    assert sf.create_drafter("prompt_lookup", target).policy.next_gamma() == 10


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_ngram": 0}, "min_ngram must be an integer >= 1, got 0"),
        ({"min_ngram": 3, "max_ngram": 2}, r"max_ngram \(2\) must be >= min_ngram \(3\)"),
        ({"branches": 0}, "branches must be an integer >= 1, got 0"),
        ({"gamma": 0}, "gamma must be an integer >= 1, got 0"),
        ({"policy": "fast"}, "unknown draft-length policy 'fast'"),
    ],
)
def test_bad_options_are_refused(options, message):
    target = sf.testing.tiny_target("llama", vocab_size=16)
    with pytest.raises(ValueError, match=message):
        sf.create_drafter("prompt_lookup", target, **options)
    with pytest.raises(ValueError, match=message):
        PromptLookupDrafter(target, **options)


def test_unknown_option_names_the_key():
    target = sf.testing.tiny_target("llama", vocab_size=16)
    with pytest.raises(TypeError, match="unknown option 'branch'; did you mean 'branches'"):
        sf.create_drafter("prompt_lookup", target, branch=2)


def test_first_pass_drafts_from_the_prompt():
    target = sf.testing.tiny_target("llama", vocab_size=8)
    plain = sf.generate(target, None, list(REPEAT_PROMPT), max_new_tokens=20)
    cls, factory = _recording()
    result = sf.generate(target, factory(target), list(REPEAT_PROMPT), max_new_tokens=20)
    assert result.tokens == plain.tokens
    assert cls.sizes[0] == 10  # the prompt's last "2 3 1" was followed by "2 3 1 ..."
    assert cls.drafts > 1 and result.metrics.mean_accepted_length > 2


def test_index_follows_the_committed_tokens():
    target = sf.testing.tiny_target("llama", vocab_size=8)
    drafter = PromptLookupDrafter(target)
    result = sf.generate(target, drafter, list(PROMPT), max_new_tokens=30)
    committed = list(PROMPT) + result.tokens
    # the index caught up at each proposal: the tokens up to the last one (the last pass's end the request)
    assert drafter.index.tokens == committed[: len(drafter.index)]
    assert len(drafter.index) < len(committed)
    fresh = NgramIndex(1, 3, drafter.index.tokens)
    assert [list(drafter.index.occurrences(n)) for n in (1, 2, 3)] == [list(fresh.occurrences(n)) for n in (1, 2, 3)]


def test_proposals_follow_the_context_without_observe():
    target = sf.testing.tiny_target("llama", vocab_size=8)
    drafter = PromptLookupDrafter(target, gamma=3)
    ctx = sf.DecodeContext(target, torch.tensor([1, 2, 3]), sf.SamplingConfig(), torch.Generator(), [1, 2, 3])
    drafter.begin(ctx)
    assert len(drafter.propose(ctx, 3)) == 0
    ctx.tokens += [1, 2]  # committed without observe(): the index catches up from ctx.tokens
    assert drafter.propose(ctx, 3).tokens.tolist() == [3, 1, 2]
    ctx.tokens[:] = [5, 6, 5, 7, 5, 2]  # not an extension of what was indexed: rebuilt ("2" is new)
    assert len(drafter.propose(ctx, 3)) == 0
    assert drafter.index.tokens == [5, 6, 5, 7, 5, 2]
    ctx.tokens[:] = [5, 6, 5, 7, 5, 7]  # same length, another last token: rebuilt
    assert drafter.propose(ctx, 3).tokens.tolist() == [5, 7, 5]


def _eos_target():
    model = tiny_model("llama", 8)
    model.generation_config.eos_token_id = 0
    return sf.load_target(model)


EOS_PROMPT = [1, 2, 3, 4, 5, 4, 5, 4, 0, 4, 5]  # "4 5" was last followed by "4 0"; the target says 4, 0 too


def test_default_branches_are_one_greedy_and_two_when_sampling():
    target = sf.testing.tiny_target("llama", vocab_size=8)
    drafter = PromptLookupDrafter(target, gamma=2)
    assert drafter.config.branches is None
    for sampling, expected in [
        (sf.SamplingConfig(), ([3, 1], [-1, 0])),  # greedy: the most recent match alone, a chain
        (sf.SamplingConfig(temperature=0.7, top_p=0.9), ([3, 1, 2, 1], [-1, 0, -1, 2])),  # "1 3", then "1 2"
    ]:
        ctx = sf.DecodeContext(target, torch.tensor(TREE_PROMPT), sampling, torch.Generator(), list(TREE_PROMPT))
        drafter.begin(ctx)
        draft = drafter.propose(ctx, 2)
        assert (draft.tokens.tolist(), draft.parents.tolist()) == expected
    ctx = sf.DecodeContext(target, torch.tensor(TREE_PROMPT), sf.SamplingConfig(temperature=0.7), torch.Generator(),
                           list(TREE_PROMPT))
    chain = PromptLookupDrafter(target, gamma=2, branches=1)  # set explicitly: kept when sampling
    chain.begin(ctx)
    assert chain.propose(ctx, 2).parents.tolist() == [-1, 0]


@pytest.mark.parametrize(("branches", "greedy", "expected"), [(None, True, 1), (None, False, 2), (3, True, 3),
                                                               (1, False, 1)])
def test_resolve_branches(branches, greedy, expected):
    assert resolve_branches(branches, greedy) == expected


def test_generation_stops_at_an_eos_inside_a_proposal():
    target = _eos_target()
    assert sf.generate(target, None, EOS_PROMPT, max_new_tokens=20).tokens == [4, 0]
    result = sf.generate(target, PromptLookupDrafter(target), EOS_PROMPT, max_new_tokens=20)
    assert result.tokens == [4, 0]
    assert result.metrics.target_passes == 1  # the draft "4 0" was accepted whole; the bonus token is dropped


def test_the_loop_truncates_tokens_accepted_after_eos():
    class NoStop(PromptLookupDrafter):
        def begin(self, ctx):
            super().begin(ctx)
            self.stop = frozenset()  # propose past EOS: "4 0 4 5 4 0 ..."

    target = _eos_target()
    drafter = NoStop(target)
    ctx = sf.DecodeContext(target, torch.tensor(EOS_PROMPT), sf.SamplingConfig(), torch.Generator(), list(EOS_PROMPT))
    drafter.begin(ctx)
    assert drafter.propose(ctx, 8).tokens.tolist() == [4, 0, 4, 5, 4, 0, 4, 5]
    result = sf.generate(target, drafter, EOS_PROMPT, max_new_tokens=20)
    assert result.tokens == [4, 0]
    assert result.metrics.accepted_tokens > 2  # the target accepted draft tokens past EOS; the loop cut them


@pytest.mark.parametrize("branches", [1, 3])
def test_greedy_equals_transformers(branches):
    reports = assert_greedy_equivalent(lambda t: PromptLookupDrafter(t, branches=branches, gamma=4), gamma=4)
    assert all(report.proposed_tokens > 0 for report in reports)
    assert any(report.depth.trees > 0 for report in reports) == (branches > 1)


def test_greedy_tree_equals_plain_decoding_with_trees_proposed():
    target = sf.testing.tiny_target("llama", vocab_size=8, seed=3)
    cls, factory = _recording(branches=3, gamma=4)
    drafter = factory(target)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        prompt = torch.randint(0, 8, (12,), generator=gen).tolist()
        assert (
            sf.generate(target, drafter, prompt, max_new_tokens=40).tokens
            == sf.generate(target, None, prompt, max_new_tokens=40).tokens
        )
    assert cls.trees > 0


def test_lossless_chain_on_the_conformance_prompt_with_drafts():
    cls, factory = _recording()
    assert_lossless(factory, configs=SAMPLING_MATRIX[:1], min_depth=1)  # deterministic copies: depth 2+ is rare here
    assert cls.drafts > 500  # about a third of the 2000 generations drafted in their second pass


def test_lossless_tree_from_the_first_pass():
    cls, factory = _recording(branches=3)
    fit = _assert_fit(factory, SAMPLING_MATRIX[1], TREE_PROMPT)
    assert cls.trees >= fit.samples  # every generation's first pass proposed a tree


def test_lossless_with_the_default_branches_when_sampling():
    cls, factory = _recording()  # branches unset: two when sampling
    fit = _assert_fit(factory, SAMPLING_MATRIX[1], TREE_PROMPT)
    assert cls.trees >= fit.samples  # the default proposed a tree in every generation's first pass


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("branches", [1, 3])
def test_lossless_full_matrix(family, branches):
    assert_lossless(lambda t: PromptLookupDrafter(t, branches=branches), family=family, min_depth=1)


@pytest.mark.slow
@pytest.mark.parametrize("branches", [1, 3])
@pytest.mark.parametrize("sampling", SAMPLING_MATRIX, ids=["t1", "t07-p09", "k5"])
@pytest.mark.parametrize("prompt", [TREE_PROMPT, REPEAT_PROMPT], ids=["tree", "repeat"])
def test_lossless_matrix_with_first_pass_drafts(branches, sampling, prompt):
    _assert_fit(lambda t: PromptLookupDrafter(t, branches=branches), sampling, prompt)
