"""The bound that tells an idle pass without valuing nor planning it: no plan on the prospects beats it, whatever
their values, and the batched loop's decisions over a run are the ones it made valuing and planning every pass."""

import random

import pytest
import torch
from batch_clock import FakeClock, priced_run
from flawed_oracle import FlawedOracle

import specfamily as sf
from specfamily.core import batch_goodput, batch_loop, batch_plan
from specfamily.core.arrivals import LoopClock
from specfamily.core.batch_hold import VerdictHold
from specfamily.core.batch_lengths import LengthPolicy, Prospect, _joint, pay_bound, plan_lengths
from specfamily.testing import tiny_target


def _case(rng: random.Random, batch: int) -> tuple[list[Prospect], list[float]]:
    prospects = []
    for _ in range(batch):
        depth = rng.randint(0, 6)
        rows = [rng.randint(1, 3) for _ in range(depth)]
        prospects.append(Prospect([rng.random() for _ in range(depth)], rows, context=rng.randint(0, 200)))
    top = batch + sum(sum(p.rows) for p in prospects)
    seconds, t = [], 1.0
    for _ in range(top + 1):
        t += rng.choice([0.0, 0.001, 0.01, 0.1]) * rng.random()
        seconds.append(t)
    return prospects, seconds


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_no_plan_on_the_prospects_beats_the_bound_however_they_are_valued(batch):
    rng = random.Random(batch)
    for _ in range(300):
        prospects, seconds = _case(rng, batch)
        if not any(p.acceptance for p in prospects):
            continue
        step, row_token = rng.choice([0.0, 0.05]), rng.choice([0.0, 1e-4])
        row_context = row_token * min(p.context for p in prospects)
        alike = pay_bound(prospects, seconds, step, 1.0 / batch, row_context)
        assert plan_lengths(prospects, seconds, step, row_token=row_token)[1] <= alike + 1e-12
        assert plan_lengths(prospects, seconds, step, True, row_token)[1] <= alike + 1e-12  # a probe's
        weights = [rng.random() for _ in prospects]  # any values, the bound's share their largest
        values = [w / sum(weights) for w in weights]
        behind = [0] + [rng.randint(0, 2) for _ in prospects[1:]]  # the slots that end the batch are 0 behind
        valued = [
            Prospect(p.acceptance, p.rows, v, b, 5, p.context)
            for p, v, b in zip(prospects, values, behind, strict=True)
        ]
        share = max(values)
        bound = pay_bound(prospects, seconds, step, share, row_context)
        assert plan_lengths(valued, seconds, step, row_token=row_token)[1] <= bound + 1e-12
        apart = pay_bound(prospects, seconds, step, 1.0, row_context)  # the joint plan's, any share
        assert _joint(valued, seconds, step, row_token)[1] <= apart + 1e-12


def test_a_level_that_feeds_no_row_is_not_bounded():
    assert pay_bound([Prospect([0.5, 0.5], [1, 0])], [1.0, 1.0, 1.0, 1.0], 0.0) == float("inf")


def test_hopeless_passes_are_the_idle_ones_and_a_due_probe_is_never_hopeless():
    """Over scripted passes whose costs make drafting lose, every pass ``hopeless`` tells idle is idle when decided,
    and the bound tells most idle passes apart."""
    policy = LengthPolicy(probe_every=4, max_backoff=2)
    chains = [Prospect([0.6] * 4, [1] * 4)] * 8
    told = idle = 0
    for _ in range(80):
        hopeless = policy.hopeless(chains, proposed=True, share=1 / 8)
        decided = policy.decision(chains)
        assert not hopeless or decided[2] == "idle"
        told += hopeless
        idle += decided[2] == "idle"
        lengths = policy.lengths(chains, True, decided=decided)
        rows = 8 + sum(lengths)
        policy.timed(8, rows, max(lengths), 0.0, 1.0 + 0.02 * rows**2)
        policy.settle([1 + min(g, 1) for g in lengths], 1.0 + 0.02 * rows**2)
    assert idle >= 60 and told >= idle - 2


def _run(monkeypatch, bounded: bool):
    kinds, counts = [], {"finishing": 0, "decide": 0, "hopeless": 0}
    decide, plan, hopeless = LengthPolicy._decide, LengthPolicy._plan, LengthPolicy.hopeless

    def deciding(self, *a, **k):
        counts["decide"] += 1
        return decide(self, *a, **k)

    def planning(self, batch, prospects, proposed, together, decided=None):
        made = decided or decide(self, batch, prospects, proposed, together)
        kinds.append((batch, made[2], tuple(made[0])))
        return plan(self, batch, prospects, proposed, together, made)

    def bounding(self, *a, **k):
        told = bounded and hopeless(self, *a, **k)
        counts["hopeless"] += told
        return told

    def valuing(*a, **k):
        counts["finishing"] += 1
        return batch_goodput.finishing(*a, **k)

    monkeypatch.setattr(LengthPolicy, "_decide", deciding)
    monkeypatch.setattr(LengthPolicy, "_plan", planning)
    monkeypatch.setattr(LengthPolicy, "hopeless", bounding)
    monkeypatch.setattr(batch_plan, "finishing", valuing)
    every_pass = lambda: VerdictHold(passes=1, per_slot=0)  # noqa: E731 (each pass planned: test_batch_hold)
    monkeypatch.setattr(batch_loop, "VerdictHold", every_pass)
    drafter_of = lambda target: FlawedOracle(target, gamma=4, policy="auto", horizon=96)  # noqa: E731
    _, seen = priced_run(
        monkeypatch, lambda b, n: 1.0 + 0.02 * n**2, drafter_of, [0.0] * 12, max_batch=6, max_new_tokens=40
    )
    return kinds, seen, counts


def test_the_loop_decides_as_if_it_valued_and_planned_every_pass(monkeypatch):
    """A run whose drafts lose at B=6 (a last wave from its first pass): with the bound, the same passes feed the
    same drafts and the plan records the same kinds as valuing and planning every pass, with most of the
    valuations and plans skipped; the texts are greedy's (``priced_run``)."""
    bounded = _run(monkeypatch, True)
    monkeypatch.undo()
    full = _run(monkeypatch, False)
    assert bounded[0] == full[0] and bounded[1] == full[1]
    idle = sum(kind == "idle" for _, kind, _ in full[0])
    assert idle >= 35 and bounded[2]["hopeless"] >= 5  # the tied passes' (untied ones are valued: share 1)
    assert bounded[2]["decide"] == full[2]["decide"] - bounded[2]["hopeless"]
    # a tied last wave, not near its end, is not valued (every token alike): fewer valuations than plans
    assert bounded[2]["finishing"] == full[2]["finishing"] < len(full[0])


def test_a_drafted_pass_is_settled_with_its_plans_own_seconds(monkeypatch):
    """What a drafted pass realized is learned over the seconds from its plan on (the plan's host work included:
    plain decoding spends none), not from its proposal on."""
    clock, settled = FakeClock(), []
    forward, gammas, settle = batch_loop.BatchTarget.forward, batch_loop._Batch._load_gammas, LengthPolicy.settle

    def priced(self, lo, feeds, features=False):
        clock.t += 1.0
        return forward(self, lo, feeds, features)

    def slow_plan(self, group):
        clock.t += 0.25
        return gammas(self, group)

    def recording(self, committed, seconds):
        settled.append((self.predicted is not None, seconds))
        return settle(self, committed, seconds)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", priced)
    monkeypatch.setattr(batch_loop._Batch, "_load_gammas", slow_plan)
    monkeypatch.setattr(LengthPolicy, "settle", recording)
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 64, (3 + i,), generator=gen).tolist() for i in range(12)]
    drafter = FlawedOracle(target, gamma=4, policy="auto", horizon=96)
    sf.generate_batch(target, drafter, prompts, 40, max_batch=4, clock=LoopClock(clock.now, clock.sleep))
    drafted = [seconds for predicted, seconds in settled if predicted]
    assert len(drafted) >= 3 and all(s == pytest.approx(1.25) for s in drafted)
