"""merge's per-part draft lengths (specfamily.drafters.merge.policy): each part's own policy decides for its part, and
hears its own share of each pass."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.core.policy import AutoPolicy
from specfamily.core.policy_kept import continue_policy
from specfamily.core.schedules import ConstantPolicy
from specfamily.core.types import Draft
from specfamily.drafters.merge.drafter import MergeDrafter
from specfamily.drafters.merge.policy import PartPass, PartsPolicy, part_report, shares
from specfamily.testing import tiny_target

LOOKUP_PROMPT = (1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3)


def _chain(n: int, catch_up: float = 0.0) -> Draft:
    draft = Draft(torch.arange(n), torch.arange(n) - 1)
    draft.catch_up_seconds = catch_up
    return draft


class Spy(ConstantPolicy):
    """A constant policy that keeps every update it hears."""

    def __init__(self, gamma: int) -> None:
        super().__init__(gamma)
        self.heard: list[tuple] = []

    def update(self, proposed, accepted, c=None, tokens=None, verified=None, overhead=None) -> None:
        self.heard.append((proposed, accepted, c, tokens, verified, overhead))


def test_shares_split_the_draft_time_without_catch_up_and_the_catch_up():
    passes = [PartPass(_chain(2), 0.001), PartPass(_chain(3, catch_up=0.004), 0.013), PartPass(Draft.empty())]
    flat = [share for pair in shares(passes) for share in pair]
    assert flat == pytest.approx([0.1, 0.0, 0.9, 1.0, 0.0, 0.0])


def test_a_part_s_report_is_its_own_depth_path_and_share_of_c():
    own = PartPass(_chain(4), 0.01)
    report = part_report(own, [0, 1], (0.5, 0.25), pass_c=0.8, pass_overhead=0.4, cost_ratio=1.5)
    assert (report.proposed, report.accepted, report.tokens, report.verified) == (4, 2, 4, 3)
    assert report.c == pytest.approx(0.8 * 0.5 / 4 * 1.5) and report.overhead == pytest.approx(0.4 * 0.25 * 1.5)
    idle = part_report(PartPass(Draft.empty()), [], (0.0, 0.0), 0.8, 0.4, 1.0)
    assert (idle.proposed, idle.c, idle.overhead, idle.verified) == (0, None, None, 0)


def test_each_part_hears_its_own_part_of_the_merged_pass():
    cheap, dear = Spy(3), Spy(2)
    policy = PartsPolicy([cheap, dear], [3, 2], ["suffix", "eagle3"])
    assert policy.next_gamma() == 3 and policy.take() == [3, 2] and policy.take() is None
    # the merged pass: depth 3, 5 tokens, c 0.2 (draft seconds per depth over the verification's)
    policy.update(3, 2, c=0.2, tokens=5, verified=3, overhead=None)
    policy.report_parts([PartPass(_chain(3), 0.0001), PartPass(_chain(2), 0.0099)], [[0, 1], []])
    (p1, a1, c1, t1, v1, o1), (p2, a2, c2, t2, v2, o2) = cheap.heard[0], dear.heard[0]
    assert (p1, a1, t1, v1, o1) == (3, 2, 3, 3, None) and (p2, a2, t2, v2, o2) == (2, 0, 2, 1, None)
    assert c1 == pytest.approx(0.6 * 0.01 / 3) and c2 == pytest.approx(0.6 * 0.99 / 2)  # no curve bound: ratio 1
    policy.report_parts([PartPass(_chain(3)), PartPass(_chain(2))], [[], []])  # nothing kept: nothing told
    assert len(cheap.heard) == len(dear.heard) == 1


def _auto(gamma: int) -> AutoPolicy:
    policy = AutoPolicy(gamma, max_gamma=gamma, probe_every=1000, max_probe_every=1000)
    policy.bind(lambda tokens: 1.0 + 0.02 * tokens)
    return policy


def test_a_part_whose_drafts_do_not_pay_drafts_nothing_while_a_cheap_one_goes_on():
    """The failure this module fixes: one policy for the merge saw the dear part's cost and cut the free part too."""
    free, dear = _auto(3), _auto(3)
    policy = PartsPolicy([free, dear], [3, 3], ["suffix", "eagle3"])
    for _ in range(12):
        planned = (policy.next_gamma(), policy.take())[1]
        depth = max(planned)
        if not depth:
            continue
        passes = [PartPass(_chain(planned[0]), 0.0001), PartPass(_chain(planned[1]), 0.05)]
        policy.update(depth, 2, c=0.05 / depth / 0.03, tokens=sum(planned), verified=3)
        policy.report_parts(passes, [[0, 1] if planned[0] else [], []])  # the free part's drafts are accepted
    policy.next_gamma()
    free_gamma, dear_gamma = policy.take()
    assert free_gamma >= 2 and dear_gamma == 0
    assert "suffix: drafted in 100% of passes" in policy.describe() and "eagle3: drafted in" in policy.describe()


def test_merge_at_its_defaults_lets_each_part_decide_and_stays_greedy_identical():
    target = tiny_target("llama")
    options = {"eagle3": {"weights": "random", "total_tokens": 8}}
    drafter = sf.create_drafter("merge", target, parts=["prompt_lookup", "eagle3"], options=options)
    assert isinstance(drafter, MergeDrafter) and isinstance(drafter.policy, PartsPolicy)
    assert drafter.policy.policies == [part.policy for part in drafter.parts]
    seen = []
    propose = drafter.propose

    def spy(ctx, gamma):
        draft = propose(ctx, gamma)
        seen.append([len(own.draft) for own in drafter.passes])
        return draft

    drafter.propose = spy
    plain = sf.generate(target, None, list(LOOKUP_PROMPT), max_new_tokens=24).tokens
    result = sf.generate(target, drafter, list(LOOKUP_PROMPT), max_new_tokens=24)
    assert result.tokens == plain and seen and any(sizes[0] for sizes in seen)
    assert "prompt_lookup: " in result.metrics.policy_note and "eagle3: " in result.metrics.policy_note


def test_a_merged_gamma_keeps_one_policy_for_the_merge():
    target = tiny_target("llama")
    drafter = sf.create_drafter("merge", target, parts=["prompt_lookup"], gamma=3)
    assert isinstance(drafter.policy, ConstantPolicy)


def test_a_later_part_is_credited_only_what_it_added_beyond_the_earlier_parts():
    first, later = Spy(4), Spy(4)
    policy = PartsPolicy([first, later], [4, 4], ["suffix", "eagle3"])
    assert policy.credit == "marginal"
    passes = [PartPass(_chain(4), 0.0001), PartPass(_chain(4), 0.01)]
    for first_path, later_path in (([0, 1], [0, 1]), ([0], [0, 1, 2]), ([0, 1, 2], [0])):
        policy.next_gamma()
        policy.update(4, 3, c=0.1, tokens=8, verified=4)
        policy.report_parts(passes, [first_path, later_path])
    # (proposed, accepted, verified): the first part hears its own path; the later one what it added beyond it,
    # its next depth counted as tried and rejected
    assert [(p, a, v) for p, a, _, _, v, _ in first.heard] == [(4, 2, 3), (4, 1, 2), (4, 3, 4)]
    assert [(p, a, v) for p, a, _, _, v, _ in later.heard] == [(4, 0, 1), (4, 2, 3), (4, 0, 1)]
    own = Spy(4)
    policy = PartsPolicy([Spy(4), own], [4, 4], ["suffix", "eagle3"], credit="own")
    policy.next_gamma()
    policy.update(4, 2, c=0.1, tokens=8, verified=3)
    policy.report_parts(passes, [[0, 1], [0, 1]])
    assert [(p, a, v) for p, a, _, _, v, _ in own.heard] == [(4, 2, 3)]  # as if it had drafted alone


def test_credit_is_checked():
    with pytest.raises(ValueError, match="merge credit must be one of marginal, own, got 'all'"):
        PartsPolicy([Spy(1)], [1], ["suffix"], credit="all")
    with pytest.raises(ValueError, match="merge credit must be one of marginal, own, got 'all'"):
        sf.create_drafter("merge", tiny_target("llama"), parts=["prompt_lookup"], credit="all")
    drafter = sf.create_drafter("merge", tiny_target("llama"), parts=["prompt_lookup"], credit="own")
    assert drafter.policy.credit == "own"


@pytest.mark.parametrize(("credit", "windows"), [("marginal", [64.0, 0.0, 0.0]), ("own", [64.0, 64.0, 64.0])])
def test_parts_credited_their_marginal_tokens_start_each_request_from_the_fixed_prior(credit, windows):
    """A later part's marginal acceptance depends on what the parts before it covered in each request: its earlier
    requests are no prior for the next (run_window 0); the first part's, and every part's own path, are."""
    policies = [AutoPolicy(3) for _ in range(3)]
    PartsPolicy(policies, [3, 3, 3], ["suffix", "eagle3", "recycling"], credit=credit)
    assert [p.run_window for p in policies] == windows
    later = policies[-1]
    later.update(1, 0, 0.05, tokens=1)
    later.reset()
    assert later.earlier_alpha() == (0.6 if credit == "marginal" else pytest.approx(1.2 / 3))


def test_a_fresh_merge_resumes_each_parts_policy_from_the_last_merge_of_the_same_parts():
    """Each part's policy continues from the same part's in the merge that ran before (its costs and counts, as
    ``AutoPolicy.resume`` copies them); a merge of other parts, caps or credit does not, nor one that already ran."""
    ran = [AutoPolicy(3, verify_cost=1.0), AutoPolicy(3, verify_cost=1.0)]
    previous = PartsPolicy(ran, [3, 3], ["suffix", "eagle3"])
    for _ in range(4):
        previous.next_gamma()
        for policy in ran:
            policy.update(2, 1, 0.05, tokens=2)
    fresh = PartsPolicy([AutoPolicy(3), AutoPolicy(3)], [3, 3], ["suffix", "eagle3"])
    assert fresh.resume(previous)
    assert [p.tried for p in fresh.policies] == [p.tried for p in ran] and fresh.policies[0].tried is not ran[0].tried
    assert [p.c_estimate for p in fresh.policies] == [p.c_estimate for p in ran] and ran[0].c_estimate is not None
    for other in (PartsPolicy([AutoPolicy(3), AutoPolicy(3)], [3, 3], ["suffix", "recycling"]),
                  PartsPolicy([AutoPolicy(3), AutoPolicy(3)], [3, 2], ["suffix", "eagle3"]),
                  PartsPolicy([AutoPolicy(3), AutoPolicy(3)], [3, 3], ["suffix", "eagle3"], credit="own")):
        assert not other.resume(previous) and all(p.c_estimate is None for p in other.policies)
    assert not previous.resume(previous) and not fresh.resume(AutoPolicy(3))
    constant = PartsPolicy([Spy(3), Spy(3)], [3, 3], ["suffix", "eagle3"])  # parts without resume: nothing to do
    assert not constant.resume(PartsPolicy([Spy(3), Spy(3)], [3, 3], ["suffix", "eagle3"]))


def test_a_fresh_merge_drafter_continues_its_parts_after_one_ran_on_the_same_target():
    """What ``generate`` does before each request (``continue_policy``): a fresh merge drafter's parts start from the
    last merge's on the target, where before this hook they started cold."""
    target = tiny_target("llama")
    options = {"eagle3": {"weights": "random", "total_tokens": 8}}
    first = sf.create_drafter("merge", target, parts=["prompt_lookup", "eagle3"], options=options)
    sf.generate(target, first, list(LOOKUP_PROMPT), max_new_tokens=12)
    assert first.policy.policies[0].c_estimate is not None
    second = sf.create_drafter("merge", target, parts=["prompt_lookup", "eagle3"], options=options)
    assert continue_policy(target, second)
    assert [p.c_estimate for p in second.policy.policies] == [p.c_estimate for p in first.policy.policies]
    assert target.batch_realized[("policy", "MergeDrafter")].policy is second.policy


def test_a_part_asked_for_a_draft_that_came_back_empty_reports_its_share_of_the_draft_time():
    """As the loop does for an empty draft it asked for (``core.loop._report``): its proposal's time over the pass
    is its c. Beside a part that drafted, its share of the merged pass's draft time, priced against a pass of its
    own size (a plain one); in a pass where every part came back empty, its share of the loop's c."""
    asked = part_report(PartPass(Draft.empty(), 0.002, asked=True), [], (0.25, 0.0), 0.8, None, 1.5)
    assert (asked.proposed, asked.accepted, asked.tokens) == (0, 0, 0) and asked.c == pytest.approx(0.8 * 0.25 * 1.5)
    drafted, empty = Spy(3), Spy(3)
    policy = PartsPolicy([drafted, empty], [3, 3], ["suffix", "rest"], verify_cost=lambda n: 1.0 + n / 10)
    policy.next_gamma(), policy.take()
    policy.update(2, 1, c=0.1, tokens=2)  # the merged pass: part 0's 2-token chain; part 1 asked, found nothing
    policy.report_parts([PartPass(_chain(2), 0.003, asked=True), PartPass(Draft.empty(), 0.001, asked=True)],
                        [[0], []])
    assert empty.heard[0][:2] == (0, 0) and empty.heard[0][2] == pytest.approx(0.1 * 2 * 0.25 * 1.2 / 1.0)
    policy.next_gamma(), policy.take()
    policy.update(0, 0, c=0.05)  # a pass where both came back empty: the loop's c is the whole proposal time
    policy.report_parts([PartPass(Draft.empty(), 0.003, asked=True), PartPass(Draft.empty())], [[], []])
    assert drafted.heard[1][:3] == (0, 0, pytest.approx(0.05)) and empty.heard[1][:3] == (0, 0, None)  # not asked
    policy.update(0, 0, c=None)  # not asked at all: nothing to tell
    policy.report_parts([PartPass(Draft.empty()), PartPass(Draft.empty())], [[], []])
    assert len(drafted.heard) == len(empty.heard) == 2
