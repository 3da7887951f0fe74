"""A batched draft step costs what it cost in the drafter's earlier runs, measured without its catch-up."""

import torch
from batch_clock import FakeClock, price_passes

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.arrivals import LoopClock
from specfamily.testing import OracleDrafter, tiny_target

CATCH_UP, STEP = 0.5, 0.1


class SlowOracle(OracleDrafter):
    """The target's greedy continuation, each proposal taking a catch-up of CATCH_UP (reported as such) and STEP a
    token drafted on the loop's fake clock."""

    clock: FakeClock | None = None

    def propose(self, ctx, gamma):
        draft = super().propose(ctx, gamma)
        if len(draft):
            SlowOracle.clock.t += CATCH_UP + STEP * len(draft)
            draft.catch_up_seconds = CATCH_UP
        return draft


def test_a_later_run_plans_its_first_drafts_with_the_steps_earlier_runs_measured_without_their_catch_up(monkeypatch):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    clock = SlowOracle.clock = FakeClock()
    price_passes(monkeypatch, clock)
    first_step = []
    lengths = batch_loop.LengthPolicy.lengths

    def planned(self, prospects, *args, **kwargs):
        if not first_step:
            first_step.append(self.costs.draft_step(len(prospects)))
        return lengths(self, prospects, *args, **kwargs)

    monkeypatch.setattr(batch_loop.LengthPolicy, "lengths", planned)
    prompts = [[3, 5, 7], [2, 4, 6, 8]]
    for run in range(2):
        first_step.clear()
        results = sf.generate_batch(target, SlowOracle(target, gamma=4, policy="auto", horizon=200), prompts,
                                    max_new_tokens=30, clock=LoopClock(clock.now, clock.sleep))
        assert [r.tokens for r in results] == [sf.generate(target, None, p, max_new_tokens=30).tokens
                                                 for p in prompts]
        if run == 0:
            assert first_step == [0.0]  # nothing measured yet
            kept = target.batch_draft_steps["SlowOracle"][2]
            assert len(kept) > 0 and all(0 < s <= 2 * STEP + 1e-9 for s in kept)  # two slots a step, no catch-up
    assert 0 < first_step[0] <= 2 * STEP + 1e-9  # the second run's first plan prices a step at what the first measured
