"""A drafter's catch-up before it drafts is learned per token of backlog and priced by the plans that draft it."""

import pytest
import torch
from batch_clock import FakeClock, price_passes

import specfamily as sf
from specfamily.core.arrivals import LoopClock
from specfamily.core.batch_catchup import CatchUp, kept_catch_up
from specfamily.core.batch_goodput import plan_together
from specfamily.core.batch_lengths import Prospect, plan_lengths
from specfamily.testing import OracleDrafter, tiny_target


def test_the_rate_is_seconds_over_tokens_caught_up_in_the_latest_window():
    rate = CatchUp(window=2)
    assert rate.per_token() == 0.0
    rate.observe(0, 5.0)  # no backlog: nothing to learn
    rate.observe(10, 1.0)
    rate.observe(30, 3.0)
    assert rate.per_token() == pytest.approx(0.1)
    rate.observe(10, 3.0)  # the first pass leaves the window
    assert rate.per_token() == pytest.approx(6.0 / 40)


def test_a_start_is_paid_once_by_a_plan_that_drafts_its_slot():
    seconds = [1.0] * 2 + [1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    free = [Prospect([0.9, 0.9], [1, 1]), Prospect([0.9, 0.9], [1, 1])]
    assert plan_lengths(free, seconds, 0.0)[0] == [2, 2]
    late = [Prospect([0.9, 0.9], [1, 1], start=0.0), Prospect([0.9, 0.9], [1, 1], start=2.0)]
    lengths, gain = plan_lengths(late, seconds, 0.0)
    assert lengths == [1, 0]  # the second slot's catch-up costs more than its levels bring (the best prefix)
    assert gain == pytest.approx((2 + 0.9) / 1.2 / (2 / 1.1))
    reaches, rows = [[0.9, 0.81], [0.9, 0.81]], [[1, 1], [1, 1]]
    assert plan_together(reaches, rows, seconds, 0.0, 2)[0] == 2
    assert plan_together(reaches, rows, seconds, 0.0, 2, starts=[0.0, 2.0])[0] == 0  # jointly: both pay to start


class LateOracle(OracleDrafter):
    """The target's greedy continuation, catching up LATE seconds (on the fake clock, reported) per token committed
    since it last proposed."""

    LATE = 0.01
    clock: FakeClock | None = None

    def begin(self, ctx):
        super().begin(ctx)
        self.seen = 0

    def propose(self, ctx, gamma):
        backlog, self.seen = len(ctx.tokens) - self.seen, len(ctx.tokens)
        draft = super().propose(ctx, gamma)
        LateOracle.clock.t += self.LATE * backlog
        draft.catch_up_seconds = self.LATE * backlog
        return draft


def test_the_loop_learns_the_rate_from_each_slots_backlog_and_keeps_it_on_the_target(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    clock = LateOracle.clock = FakeClock()
    price_passes(monkeypatch, clock)
    prompts = [[3, 5, 7], [2, 4, 6, 8], [1, 9, 4]]
    drafter = LateOracle(target, gamma=4, policy="auto", horizon=200)
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=30, clock=LoopClock(clock.now, clock.sleep))
    assert [r.tokens for r in results] == [sf.generate(target, None, p, max_new_tokens=30).tokens for p in prompts]
    kept = kept_catch_up(target, drafter)
    assert kept is target.batch_realized[("catch_up", "LateOracle")] and len(kept.passes) >= 3
    assert kept.per_token() == pytest.approx(LateOracle.LATE)  # the loop's backlogs are the drafter's own
