"""A copy drafter's acceptance by its match length, learned from every proposal's text (core/batch_evidence.py)."""

import torch

import specfamily as sf
from specfamily.core.batch_evidence import Evidence, Held, Proposal, band, bucket, kept_evidence, resolve
from specfamily.core.batch_lengths import Tally
from specfamily.core.types import Draft


def _draft(tokens, parents=None, evidence=2):
    parents = list(range(-1, len(tokens) - 1)) if parents is None else parents
    return Draft(torch.tensor(tokens), torch.tensor(parents), evidence=evidence)


def test_buckets_keep_short_matches_apart_and_double_past_them():
    assert [bucket(e) for e in (0, 1, 2, 3, 4, 7, 8, 15, 16, 64)] == [0, 1, 2, 3, 4, 4, 5, 5, 6, 8]


def test_a_proposal_is_decided_by_the_text_that_follows_it():
    chain = Proposal.of(_draft([5, 6, 7]), at=2)
    assert resolve(chain, [1, 2]) is None  # nothing after it yet
    assert resolve(chain, [1, 2, 5]) is None  # on its path, not past it
    assert resolve(chain, [1, 2, 5, 9]) == (2, 1)  # a verifier tries 2 levels, accepts 1
    assert resolve(chain, [1, 2, 4]) == (1, 0)
    assert resolve(chain, [1, 2, 5, 6, 7]) == (3, 3)  # whole: no level past its leaf
    tree = Proposal.of(_draft([5, 8, 6], [-1, -1, 0]), at=0)  # 5 -> 6, and 8
    assert resolve(tree, [8]) == (1, 1)  # a leaf: decided
    assert resolve(tree, [5, 6]) == (2, 2)
    assert resolve(tree, [5, 3]) == (2, 1)


def test_every_proposal_teaches_its_bucket_drafted_or_not():
    evidence = Evidence()
    evidence.hold(0, _draft([5, 6], evidence=3), at=0)
    evidence.hold(0, _draft([7], evidence=1), at=1)
    evidence.hold(0, Draft.empty(), at=1)  # nothing proposed: nothing held
    evidence.hold(0, _draft([7], evidence=0), at=1)  # no evidence: valued as before, not held
    evidence.learn(0, [5])
    assert len(evidence.pending[0]) == 2  # neither decided whole yet
    assert evidence.kept[3].tried == [1.0] and evidence.kept[3].accepted == [1.0] and 1 not in evidence.kept
    evidence.learn(0, [5, 6])  # the 3-gram's copy whole, the 1-gram's (7 after 5) missed
    assert evidence.kept[3].tried == [1.0, 1.0] and evidence.kept[3].accepted == [1.0, 1.0]
    assert evidence.kept[1].tried == [1.0] and evidence.kept[1].accepted == [0.0]
    assert evidence.pending[0] == [] and evidence.own[(0, 3, 0)].accepted == [1.0, 1.0]
    assert (0, 0, 1) not in evidence.own


def test_each_level_counts_once_its_text_decides_it_not_once_the_proposal_is_whole():
    """A proposal accepted deep is decided whole tokens after one missed at once: counting whole proposals, the
    pending acceptances were missing from every count (the misses counted first)."""
    evidence = Evidence()
    evidence.hold(0, _draft([5, 6, 7, 8], evidence=2), at=0)  # will be accepted 4 deep
    evidence.hold(0, _draft([9, 9, 9, 9], evidence=2), at=0)  # missed at depth 1
    evidence.learn(0, [5])
    assert evidence.kept[2].tried == [2.0] and evidence.kept[2].accepted == [1.0]  # whole proposals: [1.0], [0.0]
    assert [h.depth for h in evidence.pending[0]] == [1]
    evidence.learn(0, [5])  # nothing new: nothing counted twice
    assert evidence.kept[2].tried == [2.0]
    evidence.learn(0, [5, 6, 7])
    assert evidence.kept[2].tried == [2.0, 1.0, 1.0] and evidence.kept[2].accepted == [1.0, 1.0, 1.0]
    evidence.learn(0, [5, 6, 7, 3])
    assert evidence.kept[2].tried == [2.0, 1.0, 1.0, 1.0] and evidence.kept[2].accepted == [1.0, 1.0, 1.0, 0.0]
    assert evidence.pending[0] == []
    assert evidence.own[(0, 2, 0)].tried == evidence.kept[2].tried == evidence.kept[2, 0].tried
    tree = Held(Proposal.of(_draft([5, 8, 6], [-1, -1, 0]), at=0))  # 5 -> 6, and 8
    assert tree.advance([5]) == ([True], False) and tree.advance([5, 6]) == ([True], True)
    assert Held(tree.proposal).advance([8, 1]) == ([True], True) and Held(tree.proposal).advance([4]) == ([False], True)


def test_a_long_match_is_valued_above_a_short_one_and_the_request_over_the_batch():
    evidence = Evidence()
    for k in range(10):  # request 0, 64-83 tokens in (one band): every 3-gram copy accepted, every 1-gram copy missed
        evidence.hold(0, _draft([1], evidence=3), at=64 + 2 * k)
        evidence.hold(0, _draft([2], evidence=1), at=64 + 2 * k + 1)
    evidence.learn(0, [0] * 64 + [1, 9] * 10)
    pooled = [0.3, 0.5]
    long, short = evidence.alpha(0, 3, pooled, 90), evidence.alpha(0, 1, pooled, 90)
    assert evidence.alpha(0, 0, pooled, 90) is None
    # the batch's bucket: (10 + 0.3 * 2) / (10 + 2); at the band, its 10 again over that, worth 2; the request's own
    # 10 over it, worth 4
    bucket_long = (10 + 0.3 * 2) / 12
    band_long = (10 + bucket_long * 2) / 12
    assert long[0] == (10 + band_long * 4) / 14 and long[1] == 0.5
    band_short = (0 + (0.3 * 2 / 12) * 2) / 12
    assert short[0] == (0 + band_short * 4) / 14
    assert evidence.alpha(1, 3, pooled, 90)[0] == band_long  # another request: the batch's
    assert evidence.alpha(0, 3, pooled, 20)[0] == bucket_long == evidence.alpha(0, 3, pooled)[0]  # another band


def test_a_proposal_is_valued_at_its_place_in_its_text():
    """Copies missed early in the texts and accepted late: a late proposal is valued above an early one."""
    evidence = Evidence()
    for request in range(3):
        for k in range(6):
            evidence.hold(request, _draft([7], evidence=2), at=2 + k)  # band 2-3 and 4-7: missed
            evidence.hold(request, _draft([7], evidence=2), at=32 + k)  # band 32-63: accepted
        evidence.learn(request, [0] * 8 + [0] * 24 + [7] * 8)
    pooled = [0.3]
    early, late = evidence.alpha(3, 2, pooled, 5)[0], evidence.alpha(3, 2, pooled, 40)[0]
    whole = evidence.alpha(3, 2, pooled)[0]
    assert early < 0.2 < whole < 0.6 < late
    assert whole == (18 + 0.3 * 2) / 38


def test_the_batch_tallies_are_kept_on_the_target_per_drafter_class():
    target = sf.testing.tiny_target("llama", vocab_size=8)
    target.batch_realized = {}
    drafter = sf.create_drafter("prompt_lookup", target)
    kept = kept_evidence(target, drafter)
    kept.setdefault(2, Tally()).add(1, 1)
    assert kept_evidence(target, drafter) is kept and target.batch_realized[("evidence", "PromptLookupDrafter")] is kept
    assert kept_evidence(target, sf.create_drafter("suffix", target)) == {}
    assert kept_evidence(object(), drafter) == {}


def test_the_batched_loop_counts_every_proposal_its_text_decides_and_keeps_greedy_text(monkeypatch):
    """Prompt lookup under lookahead (every pass proposing): each request's text is its plain batched text, and the
    batch's tallies by bucket hold exactly the proposals that text had decided by the request's last look at it,
    drafted or cut, counted afresh here from the final texts."""
    from specfamily.core import batch_loop
    from specfamily.core.batch_lengths import LengthPolicy
    from specfamily.testing import tiny_target

    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8, 5, 6], [10, 11, 12, 10, 11, 12], [20, 21, 22, 20]]
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=24)]
    learn, planned, looked = batch_loop._Batch._learn, batch_loop._Batch._planned, Evidence.learn
    seen, last = [], {}

    def always_lookahead(self, group, drafts, seconds):  # the tiny target's pass is too fast to judge proposals cheap
        learn(self, group, drafts, seconds)
        self.lookahead = True

    def recorded(self, group, gammas, drafts, c0):
        if self.lookahead and any(gammas):
            seen.extend(
                (r.index, Proposal.of(d, len(r.new_tokens))) for r, d in zip(group, drafts, strict=True) if len(d)
            )
        return planned(self, group, gammas, drafts, c0)

    def looking(self, request, text):
        last[request] = len(text)
        return looked(self, request, text)

    monkeypatch.setattr(batch_loop._Batch, "_learn", always_lookahead)
    monkeypatch.setattr(batch_loop._Batch, "_planned", recorded)
    monkeypatch.setattr(Evidence, "learn", looking)
    monkeypatch.setattr(
        LengthPolicy, "decision", lambda self, p, together=False, contexts=None: ([1] * len(p), 1.0, "pays")
    )
    results = sf.generate_batch(target, sf.create_drafter("prompt_lookup", target), prompts, max_new_tokens=24)
    texts = [r.tokens for r in results]
    assert texts == plain
    expected: dict[int, Tally] = {}
    for index, proposal in seen:  # chains: each level the text had reached by its last look, to the first miss
        assert list(proposal.parents) == list(range(-1, len(proposal.tokens) - 1))
        future = texts[index][proposal.at : last[index]]
        for depth, token in enumerate(proposal.tokens[: len(future)], start=1):
            for key in (proposal.bucket, (proposal.bucket, band(proposal.at))):
                expected.setdefault(key, Tally()).add_level(depth, token == future[depth - 1])
            if token != future[depth - 1]:
                break
    kept = kept_evidence(target, sf.create_drafter("prompt_lookup", target))
    # several buckets and bands, many proposals
    assert sum(t.tried[0] for k, t in expected.items() if isinstance(k, int)) >= 10 and len(expected) >= 4
    assert {k: (t.tried, t.accepted) for k, t in kept.items()} == {
        k: (t.tried, t.accepted) for k, t in expected.items()
    }
