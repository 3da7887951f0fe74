"""A verdict to draft nothing is held over the passes that cannot change it: the same plans, planned less often."""

from types import SimpleNamespace

import torch
from batch_clock import priced_run

from specfamily.core import batch_loop, batch_plan
from specfamily.core.batch_hold import VerdictHold
from specfamily.core.batch_lengths import LengthPolicy
from specfamily.core.batch_plan import BatchPlanning
from specfamily.core.drafter import BaseDrafter
from specfamily.core.types import Draft
from specfamily.testing import tiny_target


def test_a_verdict_to_draft_nothing_stands_for_its_passes_while_its_key_holds():
    hold = VerdictHold(passes=3)
    hold.keep("k", "idle", drafted=False)
    assert [hold.held("k", False), hold.held("k", False), hold.held("k", False)] == ["idle", "idle", None]
    hold.keep("k", "joint", drafted=False)
    assert hold.held("other", False) is None and hold.held("k", False) is None  # a new key ends it
    hold.keep("k", "joint", drafted=False)
    assert hold.held("k", True) == "joint"  # a joint verdict is not a probe's to break
    hold.keep("k", "idle", drafted=False)
    assert hold.held("k", True) is None  # an idle pass now would probe: planned
    for kind, drafted in (("idle", True), ("pays", True), ("none", False), ("explore", True)):
        hold.keep("k", kind, drafted)
        assert hold.held("k", False) is None


def test_a_fuller_pass_holds_its_verdict_a_pass_a_slot_when_that_is_longer():
    """A plan's host time grows with the batch: a verdict of 16 slots stands 16 passes, one of 4 the 8 of ``passes``."""
    for slots, stands in ((16, 16), (4, 8), (0, 8)):
        hold = VerdictHold()
        hold.keep("k", "idle", drafted=False, slots=slots)
        assert [hold.held("k", False) for _ in range(stands)] == ["idle"] * (stands - 1) + [None]
    hold = VerdictHold(passes=1, per_slot=0)  # every pass planned (the tests that compare holding with not)
    hold.keep("k", "idle", drafted=False, slots=16)
    assert hold.held("k", False) is None


class Planner(BatchPlanning):
    """The planning half alone, in a last wave whose projected end is ``horizon`` passes off."""

    def __init__(self, horizon: int) -> None:
        self.wave_pass, self.wave, self.deepest, self.budget, self.lookahead = (horizon, 1.0), 0, 4, 40, True
        self.load = LengthPolicy()


def test_the_key_turns_where_the_last_wave_comes_within_its_joint_end():
    """Near its end (within twice the deepest draft) a last wave is planned jointly: a verdict made before does not
    stand there. A slot with fewer tokens left than the deepest draft caps it."""
    group = [SimpleNamespace(index=i, new_tokens=[0] * 10) for i in (3, 5)]
    assert Planner(10)._hold_key(group) == Planner(9)._hold_key(group) != Planner(8)._hold_key(group)
    near = [SimpleNamespace(index=i, new_tokens=[0] * 37) for i in (3, 5)]  # 3 tokens left: 2 levels at most
    assert not Planner(5)._hold_key(near)[2] and Planner(4)._hold_key(near)[2] and Planner(8)._hold_key(group)[2]
    assert Planner(9)._hold_key(group[:1]) != Planner(9)._hold_key(group)


def test_a_held_pass_is_recorded_as_its_verdict_planned():
    policy = LengthPolicy(probe_every=4)
    for _ in range(2):
        assert policy.held(3, "idle") == [0, 0, 0]
    assert policy.idle == {3: 2} and policy.choices == {3: [0, 0]} and policy.kind == "idle"
    assert policy.probe_due(3) is False
    policy.held(3, "idle")
    assert policy.probe_due(3) is True  # the fourth idle pass at B=3 would be a probe
    policy.held(3, "joint")
    assert policy.idle == {3: 3} and policy.kind == "joint" and policy.predicted is None


class Wrong(BaseDrafter):
    """Proposes the token after the last one, every time (the target's text never follows it): nothing pays."""

    default_gamma = 4

    def __init__(self, target=None, gamma=None, policy="constant"):
        super().__init__(gamma, policy)

    def propose(self, ctx, gamma):
        return Draft.chain([(ctx.tokens[-1] + 1 + i) % 64 for i in range(gamma)])


def _plans(monkeypatch, drafter, cost, passes: int, requests: int, max_batch: int) -> tuple[list, int, list[str]]:
    """(every pass's (B, draft lengths, steady), the steady passes planned anew, the verdicts held) of two runs on one
    target (the second starts from what the first kept) with verdicts held for ``passes`` passes."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    seen, planned, held = [], [0], []
    for _ in range(2):
        plan, hold = batch_plan.BatchPlanning._plan_gammas, VerdictHold.held

        def counted(self, group, plan=plan):
            planned[0] += 1
            return plan(self, group)

        def holding(self, key, probe_due, hold=hold):
            kind = hold(self, key, probe_due)
            held.append(kind) if kind else None
            return kind

        monkeypatch.setattr(batch_plan.BatchPlanning, "_plan_gammas", counted)
        monkeypatch.setattr(VerdictHold, "held", holding)
        monkeypatch.setattr(batch_loop, "VerdictHold", lambda: VerdictHold(passes=passes, per_slot=0))
        priced_run(monkeypatch, cost, lambda t: drafter(t, gamma=4, policy="auto"), [0.0] * requests, seen,
                   max_batch=max_batch, max_new_tokens=40, target=target)
        monkeypatch.undo()
    return seen, planned[0], held


def test_idle_streaks_and_their_probes_plan_as_often_as_before_at_an_eighth_of_the_planning(monkeypatch):
    """Drafts that are never accepted, rows that cost: every steady pass but the probes (every 16 idle passes,
    backing off) is idle. Held, the run feeds the same drafts on the same passes (the probes included)."""
    def costly(batch, rows):
        return 1.0 + 0.2 * rows

    every, planned_every, _ = _plans(monkeypatch, Wrong, costly, 1, 6, 3)
    held, planned_held, kinds = _plans(monkeypatch, Wrong, costly, 8, 6, 3)
    assert held == every
    probes = sum(s and sum(d) > 0 for _, d, s in held)
    assert probes >= 3  # the probes still drafted
    assert planned_held * 4 < planned_every and len(kinds) > planned_every // 2 and "idle" in kinds


def test_the_last_passes_of_last_waves_planned_jointly_plan_the_same_held(monkeypatch):
    """Drafts never accepted, rows nearly free, 8 requests in 4 slots (last waves from the first pass): far from the
    end nothing could pay (idle), near it the tied slots' joint plan drafts nothing (joint); both held, every pass
    feeds what it fed planned anew."""
    def cheap(batch, rows):
        return 1.0 + 0.01 * rows

    every, planned_every, _ = _plans(monkeypatch, Wrong, cheap, 1, 8, 4)
    held, planned_held, kinds = _plans(monkeypatch, Wrong, cheap, 8, 8, 4)
    assert held == every
    assert planned_held * 2 < planned_every and {"idle", "joint"} <= set(kinds)
