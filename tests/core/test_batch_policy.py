"""Draft length by load: t(B, n) learned from timed passes; drafting where it pays for the batch, not where not."""

import re

import pytest
import torch
from flawed_oracle import FlawedOracle

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.arrivals import LoopClock
from specfamily.core.batch_policy import BatchPolicy, LoadCosts, fed_tokens, goodput, proposing
from specfamily.testing import tiny_target


def test_load_costs_are_medians_where_measured_and_a_curve_over_tokens_fed_elsewhere():
    costs = LoadCosts(window=3)
    assert costs.seconds(1, 1) is None and costs.draft_step(4) == 0.0
    for seconds in (1.0, 9.0, 2.0, 3.0):  # window 3: the 1.0 is forgotten
        costs.observe(1, 1, seconds)
    assert costs.seconds(1, 1) == 3.0
    assert costs.seconds(1, 5) is None  # one point: nothing to predict with
    costs.observe(1, 5, 7.0)
    assert costs.curve() == ((1, 3.0), (5, 7.0))
    assert costs.seconds(1, 3) == pytest.approx(5.0)  # between the points
    assert costs.seconds(2, 5) == pytest.approx(12.0)  # 10 tokens: extended with the last slope, 1 s per token
    costs.observe(2, 1, 8.0)  # B=2 measures 2 tokens at 8.0 where the curve said 3.0 ... now a point of it
    assert costs.curve() == ((1, 3.0), (2, 8.0), (5, 7.0))
    assert costs.seconds(2, 1) == 8.0
    costs.observe(3, 0 + 1, -1.0)  # not a time: ignored
    assert not costs.known(3, 1)
    costs.observe_draft(2, 4, 2.0)
    assert costs.draft_step(2) == 0.5 and costs.draft_step(4) == 1.0  # a looping drafter: scaled by the batch


def test_goodput_and_fed_tokens():
    assert goodput([[1.0, 1.0], [0.5, 0.5]], 2, 2.0) == pytest.approx((3 + 1.75) / 2)
    assert goodput([[0.0]], 0, 0.5) == 2.0
    assert fed_tokens(3, 1.0) == 4 and fed_tokens(2, 2.5) == 6 and fed_tokens(0, 3.0) == 1


def _drive(policy: BatchPolicy, batch: int, cost, passes: int, alpha: float = 0.9, depths: int = 6) -> list[int]:
    """Ask ``policy`` for ``passes`` passes at ``batch`` requests, timing each with cost(B, n); the gammas."""
    gammas = []
    for _ in range(passes):
        gamma = policy.gamma([[alpha] * depths] * batch, 1.0)
        fed = fed_tokens(gamma, 1.0)
        policy.timed(batch, fed, gamma, 0.01 * gamma * batch, cost(batch, fed))
        gammas.append(gamma)
    return gammas


def steep(batch: int, fed: int) -> float:
    """A pass costs 1 plus a term quadratic in the tokens fed: a few tokens are free, dozens are not."""
    return 1.0 + 0.02 * (batch * fed) ** 2


def flat(batch: int, fed: int) -> float:
    return 1.0


def test_with_a_steep_cost_it_drafts_alone_and_stops_drafting_under_load():
    policy = BatchPolicy()
    alone = _drive(policy, 1, steep, 60)
    loaded = _drive(policy, 16, steep, 60)
    assert alone[:2] == [0, 1]  # a plain pass first, then one level (nothing predicts a drafted pass yet)
    assert sum(g > 0 for g in alone[2:]) >= 50 and max(alone) >= 3
    assert loaded[0] == 0 and sum(g == 0 for g in loaded) >= 54  # at most a few probes
    assert "B=1: 60 passes" in policy.describe() and "B=16: 60 passes" in policy.describe()


def test_with_a_flat_cost_it_keeps_drafting_at_every_load():
    policy = BatchPolicy()
    for batch in (1, 8, 32):
        gammas = _drive(policy, batch, flat, 40)
        assert sum(g > 0 for g in gammas) >= 37  # the plain first pass and the refreshes aside
        assert max(gammas) >= 5  # cheap passes: deep drafts pay (at B=32 the looping draft's cost stops it at 5)


def test_probes_at_a_load_that_keeps_losing_get_rarer():
    policy = BatchPolicy(probe_every=4, max_backoff=2)
    gammas = _drive(policy, 16, steep, 80)
    probes = [i for i, g in enumerate(gammas) if g > 0]
    assert probes[:2] == [1, 5]  # the exploring pass; the first probe on the 4th pass that did not draft
    gaps = [b - a for a, b in zip(probes[1:], probes[2:], strict=False)]
    assert gaps == [8, 16, 16, 16, 16]  # then every 8th, then every 16th pass = 4 * 2**max_backoff
    assert policy.losing[16] == len(probes) - 1


def test_a_probe_that_pays_resets_the_backoff():
    policy = BatchPolicy(probe_every=4)
    _drive(policy, 16, steep, 40)
    assert policy.losing[16] >= 2
    policy.costs = LoadCosts()  # the load's cost as measured anew: flat, so drafting pays again
    policy.timed(16, 1, 0, 0.0, 1.0)
    policy.timed(16, 2, 1, 0.0, 1.0)
    assert policy.gamma([[0.9] * 6] * 16, 1.0) > 0
    assert policy.losing[16] == 0 and policy.idle[16] == 0


def test_without_acceptance_depths_it_never_drafts():
    policy = BatchPolicy()
    policy.timed(2, 1, 0, 0.0, 1.0)
    assert policy.gamma([[], []], 1.0) == 0


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.mark.parametrize("cost", [steep, flat])
def test_generate_batch_drafts_by_load_from_what_its_passes_cost(monkeypatch, cost):
    """A fake clock makes each target pass cost cost(B, n). Request 0 runs alone, then 7 arrive together: with the
    steep cost it drafts alone and decodes plainly at B=7 (but for probes); with the flat one it drafts at both. The
    greedy texts are transformers' either way."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    clock, seen, prefills = FakeClock(), [], []
    forward = batch_loop.BatchTarget.forward

    def priced(self, lo, feeds, features=False):
        fed = max(feed.pending.numel() + len(feed.draft) for feed in feeds)
        seen.append((len(feeds), fed, all(feed.pending.numel() == 1 for feed in feeds)))
        prefills.append(max(len(feed.draft) for feed in feeds) if seen[-1][2] is False else None)
        clock.t += cost(len(feeds), fed)
        return forward(self, lo, feeds, features)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", priced)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 64, (3 + i,), generator=gen).tolist() for i in range(8)]
    drafter = FlawedOracle(target, gamma=4, policy="auto", horizon=96)
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=60, arrivals=[0.0] + [1000.0] * 7,
                                clock=LoopClock(clock.now, clock.sleep))
    greedy = [sf.generate(target, None, p, max_new_tokens=60).tokens for p in prompts]
    assert [r.tokens for r in results] == greedy
    alone = [fed for batch, fed, steady in seen if batch == 1 and steady]
    loaded = [fed for batch, fed, steady in seen if batch == 7 and steady]
    assert len(alone) >= 8 and len(loaded) >= 8
    assert sum(fed > 1 for fed in alone) >= len(alone) - 2  # drafted alone (a plain first pass, a refresh)
    if cost is steep:
        assert sum(fed == 1 for fed in loaded) >= len(loaded) - 3  # plain under load, but for the exploring passes
    else:
        assert sum(fed > 1 for fed in loaded) >= len(loaded) - 2
    note = results[0].metrics.policy_note
    assert note.startswith("draft length by load: B=1:")  # what planned the drafts, not the slot's own policy
    assert "the batch's load policy planned every pass" in note and "drafted in" not in note
    assert re.search(r"proposed in \d+ of the \d+ passes it was asked to, acceptance at depths 1-4 \[0\.\d\d", note)
    assert [d for d in prefills if d is not None] == [0, 0]  # the two prefill passes drafted nothing


def test_a_drafter_that_often_proposes_nothing_counts_for_that_share():
    assert proposing([0.8, 0.5], 0.25) == [0.2, 0.5] and proposing([], 0.5) == []
    assert goodput([proposing([0.8, 0.5], 0.25)], 2, 1.0) == pytest.approx(1 + 0.25 * (0.8 + 0.4))


def test_pass_costs_are_kept_on_the_target_across_runs():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    assert target.batch_pass_costs == {} and not LoadCosts.of(target).known(3, 1)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 64, (4 + i,), generator=gen).tolist() for i in range(3)]
    drafter = FlawedOracle(target, gamma=3, policy="auto", horizon=32)
    sf.generate_batch(target, drafter, prompts, max_new_tokens=12)
    assert LoadCosts.of(target).known(3, 1)  # the next run (another drafter) starts from what this one measured
    assert all(isinstance(b, int) and isinstance(n, int) for b, n in target.batch_pass_costs)
    assert not LoadCosts.of(object()).passes  # a target without the attribute: the run's own costs
