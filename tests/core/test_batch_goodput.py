"""What drafted batched passes realized, kept per drafter and batch size across runs; the batch's end planned for its
tied longest requests together (they all advance, or the batch does not end sooner)."""

import math

import pytest

from specfamily.core.batch_goodput import (
    Realized,
    backoff,
    correction,
    kept_realized,
    last_wave,
    plan_together,
    realized_gain,
)
from specfamily.core.batch_lengths import LengthPolicy, Prospect, finishing, plan_lengths
from specfamily.testing import tiny_target

SURE = Prospect([0.9] * 4, [1] * 4)
NONE = Prospect((), ())  # a request with nothing to propose (prompt lookup without a match)


def test_tied_requests_draft_to_one_depth_together_or_none_of_them_does():
    seconds = [1.0] * 40
    # the greedy plan sums the tied requests' gains: it drafts for the one with a draft, which cannot end the batch
    # sooner while the other (tied at the most tokens left) advances one token a pass
    assert plan_lengths(finishing([SURE, NONE], [10, 10]), seconds, 0.0)[0] == [4, 0]
    policy = LengthPolicy()
    policy.timed(2, 2, 0, 0.0, 1.0)
    policy.timed(2, 6, 0, 0.0, 1.0)
    assert policy.lengths(finishing([SURE, NONE], [10, 10]), together=True) == [0, 0]
    assert policy.predicted is None
    assert policy.lengths(finishing([SURE, SURE], [10, 10]), together=True) == [4, 4]
    assert policy.predicted[1] == pytest.approx(1 + sum(0.81**d for d in range(1, 5)))  # E[1 + min accepted]
    policy.timed(3, 3, 0, 0.0, 1.0)
    assert policy.lengths(finishing([SURE, SURE, SURE], [10, 3, 10]), together=True) == [4, 0, 4]  # the rest: none


def test_the_joint_plan_stops_where_the_product_of_reaches_no_longer_pays_for_the_rows():
    reaches = [[0.9, 0.81, 0.729], [0.6, 0.36, 0.216]]
    rows = [[1, 1, 1], [1, 1, 1]]
    seconds = [1.0, 1.0, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0]  # t(2, 2) = 1, then 0.2 a row
    depth, gain = plan_together(reaches, rows, seconds, 0.0, batch=2)
    assert depth == 1 and gain == pytest.approx((1 + 0.54) / 1.4)  # depth 2: (1.54 + 0.2916) / 1.8 pays less
    assert plan_together(reaches, rows, [1.0] * 8, 0.0, batch=2)[0] == 2  # free rows: as deep as the table reaches
    assert plan_together(reaches, rows, [1.0, 1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5], 0.0, batch=2) == (0, 1.0)
    assert plan_together(reaches, rows, [1.0, 1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5], 0.0, batch=2,
                         drafted=True)[0] == 1  # a probe: the best that drafts
    assert plan_together([[0.9], []], [[1], []], seconds, 0.0, batch=2) == (0, 1.0)


def test_a_joint_pass_is_settled_on_the_batchs_advance():
    """Two tied requests drafted 4 deep together: one accepted 3, the other none; the batch advanced 1 token."""
    policy = LengthPolicy()
    policy.timed(2, 2, 0, 0.0, 1.0)
    policy.timed(2, 10, 0, 0.0, 1.0)
    assert policy.lengths(finishing([SURE, SURE], [10, 10]), together=True) == [4, 4]
    policy.settle([4, 1], 1.0)
    assert list(policy.realized[2].passes) == [(pytest.approx(1 + sum(0.81**d for d in range(1, 5))), 1.0)]
    assert realized_gain(1.0, 1.0, 1.0, 1.0) == 1.0  # the pass cost a plain one and advanced the batch as one


def test_the_correction_borrows_the_nearest_load_while_its_own_window_is_short():
    losing = Realized(passes=[(2.0, 0.5)] * 8)
    realized = {4: losing}
    assert correction(realized, 4) == pytest.approx(0.25)
    assert correction(realized, 3) == pytest.approx(0.25)  # none at B=3 yet: B=4's passes
    assert correction({}, 3) == pytest.approx(0.95)  # nothing measured anywhere: the doubtful prior
    realized[2] = Realized(passes=[(1.0, 1.0)] * 8)
    assert correction(realized, 3) == pytest.approx((8 + 1.9) / 10)  # the nearest (the smaller on a tie)
    realized[3] = Realized(passes=[(1.0, 0.5)] * 4)
    assert correction(realized, 3) == pytest.approx((4 * 0.5 + 4) / 8)  # its 4 own and B=2's latest 4
    realized[3] = Realized(passes=[(1.0, 0.9)] * 8)
    assert correction(realized, 3) == pytest.approx(0.9)  # a full window: its own alone


def test_a_load_starts_its_backoff_from_its_own_record_else_the_nearest():
    realized = {4: Realized(losing=2, passes=[(2.0, 0.5)]), 8: Realized(losing=3, passes=[(2.0, 0.5)])}
    assert backoff(realized, 4) == 2 and backoff(realized, 6) == 2 and backoff(realized, 7) == 3
    assert backoff(realized, 16) == 3 and backoff({}, 4) == 0
    realized[6] = Realized(losing=0, passes=[(1.0, 1.2)])  # a probe at 6 paid: its own record counts
    assert backoff(realized, 6) == 0 and backoff(realized, 5) == 2


def test_windows_are_kept_on_the_target_per_drafter_class():
    target = tiny_target("llama", vocab_size=64, spread=1.0)
    assert target.batch_realized == {}
    kept = kept_realized(target, object())
    kept[4] = Realized(passes=[(1.0, 0.5)])
    assert kept_realized(target, object()) is kept and kept_realized(target, 1) is not kept
    assert kept_realized(object(), object()) == {}  # a target without the attribute: the run's own
    assert not math.isnan(correction(kept, 4))


def test_the_last_wave_values_the_slots_projected_to_end_last():
    assert last_wave([32, 32], 2, 32) == [1.0, 1.0]  # both take a waiting request: both end at 64, together
    assert last_wave([30, 31], 2, 32) == [0.0, 1.0]  # the slot 1 token behind ends the batch
    assert last_wave([10, 31, 20], 1, 32) == [1.0, 0.0, 0.0]  # the first to free takes the one waiting: 42
    assert last_wave([10, 31, 20], 0, 32) == [0.0, 1.0, 0.0]  # nothing waits: the longest request (finishing)
    assert last_wave([5, 5, 9], 2, 8) == [1.0, 1.0, 0.0]  # ties end together
    assert last_wave([], 0, 8) == []
    with pytest.raises(ValueError, match="a last wave has at most one waiting request a slot: 3 for 2"):
        last_wave([1, 2], 3, 8)
