"""A batched pass priced at its slots' contexts: the slopes fitted on passes of one shape at several contexts, the
context-free t(B, N) under them, and plans that price each draft row over its own slot's cache."""

import types

import pytest
import torch
from flawed_oracle import FlawedOracle

import specfamily as sf
from specfamily.core import batch_costs, batch_loop
from specfamily.core.arrivals import LoopClock
from specfamily.core.batch_costs import RowCosts, context_slopes
from specfamily.core.batch_lengths import Prospect, plan_lengths
from specfamily.testing import tiny_target

K_SLOT, K_ROW = 5e-6, 1.2e-6  # seconds per cached token: a slot's root reading its cache, a draft row attending it


def _true(batch: int, rows: int, slots: float, drafted: float) -> float:
    return 0.040 + 0.001 * batch + 0.0008 * (rows - batch) + K_SLOT * slots + K_ROW * drafted


def _passes(costs: RowCosts) -> None:
    """Plain and drafted passes at B=4 as caches grow from 100 to 700 tokens a slot, drafts in one slot or spread."""
    for length in range(100, 701, 40):
        slots = 4 * length
        costs.observe(4, 4, _true(4, 4, slots, 0), slots, 0)
        costs.observe(4, 12, _true(4, 12, slots, 8 * length), slots, 8 * length)
        short = 8 * 100 if length > 100 else 8 * 60  # the 8 draft rows in a slot of 100 (60) cached tokens
        costs.observe(4, 12, _true(4, 12, slots, short), slots, short)


def test_the_slopes_are_fitted_within_each_shape():
    costs = RowCosts(ridge=0.0)
    _passes(costs)
    groups = list(costs.passes.values())
    assert context_slopes(groups) == pytest.approx((K_SLOT, K_ROW), rel=1e-6)
    assert costs.slopes == pytest.approx((K_SLOT, K_ROW), rel=1e-6)
    assert context_slopes([[(1.0, 100.0, 0.0)]]) == (0.0, 0.0)  # one pass of a shape: nothing to fit
    falling = [[(1.0, 100.0, 0.0), (0.9, 200.0, 0.0)]]  # a pass that got cheaper as its cache grew: noise, not a slope
    assert context_slopes(falling) == (0.0, 0.0)


def test_a_pass_is_priced_at_its_contexts():
    costs = RowCosts(ridge=0.0)
    _passes(costs)
    for slots, drafted in ((400, 0), (2800, 0), (2800, 8 * 700), (1000, 8 * 90)):
        rows = 4 if drafted == 0 else 12
        assert costs.measured(4, rows, slots, drafted) == pytest.approx(_true(4, rows, slots, drafted), rel=1e-6)
    table = costs.table(4, 12, slots=2800)
    assert table[4] == pytest.approx(_true(4, 4, 2800, 0)) and table[12] == pytest.approx(_true(4, 12, 2800, 0))
    assert costs.row_token() == pytest.approx(K_ROW)
    old = RowCosts()  # passes without their contexts: the latest medians, whatever the caches held
    for length in range(100, 701, 40):
        old.observe(4, 4, _true(4, 4, 4 * length, 0))
    assert old.measured(4, 4, 400) == pytest.approx(_true(4, 4, 4 * 620, 0))


def test_a_draft_row_over_a_long_cache_costs_the_plan_more():
    """Two requests alike but for their slots' caches (100 and 3000 tokens): a draft row costs 0.5% of a pass plus
    1e-4 of it per cached token, so the short slot's levels pay and the long slot's do not (its first level would
    add 0.5 tokens to the pass's 2 for 30% more time)."""
    seconds = [1.0 + 0.005 * max(0, n - 2) for n in range(40)]
    near, far = Prospect([0.5] * 4, [1] * 4, context=100), Prospect([0.5] * 4, [1] * 4, context=3000)
    lengths, gain = plan_lengths([near, far], seconds, 0.0, row_token=1e-4)
    assert lengths[0] >= 1 and lengths[1] == 0 and gain > 1.0
    assert plan_lengths([near, far], seconds, 0.0)[0][1] >= 1  # unpriced, the long slot drafts as well


def _context_priced_run(monkeypatch) -> tuple[float, list]:
    """24 requests, 4 at a time, every fourth with a 200-token prompt (the others 4-26 tokens), on a clock where a
    pass costs 1 s plus 2 ms per draft row per cached token of its slot: (the run's seconds, (draft length, cached
    tokens) of every slot on every steady pass). The texts are greedy's."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    now, seen, forward = [0.0], [], batch_loop.BatchTarget.forward

    def priced(self, lo, feeds, features=False):
        contexts = self.cache.lengths[lo : lo + len(feeds)]
        now[0] += 1.0 + 0.002 * sum(len(f.draft) * c for f, c in zip(feeds, contexts, strict=True))
        if all(f.pending.numel() == 1 for f in feeds):
            seen.append([(len(f.draft), c) for f, c in zip(feeds, contexts, strict=True)])
        return forward(self, lo, feeds, features)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", priced)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 64, (200 if i % 4 == 0 else 3 + i,), generator=gen).tolist() for i in range(24)]
    drafter = FlawedOracle(target, gamma=4, policy="auto", horizon=96)
    clock = LoopClock(lambda: now[0], lambda s: now.__setitem__(0, now[0] + s))
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=40, clock=clock, max_batch=4)
    assert [r.tokens for r in results] == [sf.generate(target, None, p, max_new_tokens=40).tokens for p in prompts]
    return now[0], [slot for passed in seen[32:] for slot in passed]  # after the second refit


def _share(slots: list, near: bool) -> float:
    chosen = [g for g, c in slots if (c < 100 if near else c >= 200)]
    return sum(g > 0 for g in chosen) / len(chosen)


def test_generate_batch_prices_each_draft_row_over_its_slots_cache(monkeypatch):
    """With the slopes fitted the short slots draft far more often than the long ones and the run is faster than
    with the same passes priced without their contexts (slopes held at 0: t(B, N) alone, as before)."""
    seconds, slots = _context_priced_run(monkeypatch)
    assert _share(slots, near=True) >= 2 * _share(slots, near=False)
    monkeypatch.setattr(batch_costs, "context_slopes", lambda groups, ridge=0.0: (0.0, 0.0))
    unpriced, flat = _context_priced_run(monkeypatch)
    assert _share(flat, near=True) < 1.5 * _share(flat, near=False)  # unpriced: a row is a row wherever it is
    assert seconds < 0.95 * unpriced


def test_a_pass_is_priced_with_its_host_seconds_drafted_and_undrafted_apart():
    costs = RowCosts(ridge=0.0)
    _passes(costs)
    assert costs.host_seconds(4) == (0.0, 0.0)
    costs.observe_host(4, False, 0.001)
    costs.observe_host(4, False, 0.003)
    table = costs.table(4, 12, slots=2800)
    assert costs.host_seconds(4) == pytest.approx((0.002, 0.002))  # a drafted pass not measured yet: as undrafted
    assert table[4] == pytest.approx(_true(4, 4, 2800, 0) + 0.002)
    assert table[12] == pytest.approx(_true(4, 12, 2800, 0) + 0.002)
    costs.observe_host(4, True, 0.005)
    costs.observe_host(4, True, float("nan"))  # not a measurement
    table = costs.table(4, 12, slots=2800)
    assert table[4] == pytest.approx(_true(4, 4, 2800, 0) + 0.002)
    assert table[5] == pytest.approx(_true(4, 5, 2800, 0) + 0.005)
    assert table[12] == pytest.approx(_true(4, 12, 2800, 0) + 0.005)
    assert costs.measured(4, 4, 2800) == pytest.approx(_true(4, 4, 2800, 0))  # the forward alone
    assert costs.host_seconds(8) == (0.0, 0.0)


def test_a_drafted_pass_whose_host_work_eats_its_gain_is_not_planned():
    """The same prospects and forwards: drafting pays while a drafted pass's host seconds are an undrafted pass's,
    and not once they cost it more than its expected tokens buy."""
    from specfamily.core.batch_lengths import LengthPolicy

    def policy(drafted_host: float) -> LengthPolicy:
        load = LengthPolicy()
        for _ in range(3):
            load.timed(4, 4, 0, 0.0, 0.040, host=0.002)
            load.timed(4, 8, 1, 0.0, 0.044, host=drafted_host)
        return load

    prospects = [Prospect([0.5], [1])] * 4  # 4 rows: 2 tokens expected for a tenth more forward
    assert policy(0.002).lengths(prospects) == [1, 1, 1, 1]
    assert policy(0.020).lengths(prospects) == [0, 0, 0, 0]  # (6 / 0.064) / (4 / 0.042) < 1


def test_a_plan_made_after_the_proposals_prices_only_the_host_seconds_still_to_spend():
    """After proposing (lookahead) the seconds before the forward are spent whichever way the plan goes: a drafted
    pass whose extra host work all came before its forward (its proposals and their plan) is priced at an undrafted
    pass's host seconds and drafts; the same extra after its forward (its commits) is still to spend and does not;
    a plan before the proposals prices the drafted pass whole."""
    from specfamily.core.batch_lengths import LengthPolicy

    def policy(after: float) -> LengthPolicy:
        load = LengthPolicy()
        for _ in range(3):
            load.timed(4, 4, 0, 0.0, 0.040, host=0.002, after=0.001)
            load.timed(4, 8, 1, 0.0, 0.044, host=0.020, after=after)
        return load

    assert policy(0.001).costs.host_seconds(4) == pytest.approx((0.002, 0.020))
    assert policy(0.001).costs.host_seconds(4, proposed=True) == pytest.approx((0.002, 0.002))
    assert policy(0.019).costs.host_seconds(4, proposed=True) == pytest.approx((0.002, 0.020))
    table = policy(0.003).costs.table(4, 8, proposed=True)
    assert table[4] == pytest.approx(0.040 + 0.002) and table[8] == pytest.approx(0.044 + 0.004)
    prospects = [Prospect([0.5], [1])] * 4
    assert policy(0.001).lengths(prospects, proposed=True) == [1, 1, 1, 1]  # spent: (6 / 0.046) / (4 / 0.042)
    assert policy(0.019).lengths(prospects, proposed=True) == [0, 0, 0, 0]  # to spend: (6 / 0.064) / (4 / 0.042)
    assert policy(0.001).lengths(prospects) == [0, 0, 0, 0]  # before proposing: the drafted pass whole


def test_the_seconds_after_the_forward_are_kept_within_the_host_seconds():
    costs = RowCosts()
    costs.observe_host(4, True, 0.002, after=0.003)  # more after than in all: not a split, kept whole before
    costs.observe_host(4, True, 0.002, after=float("nan"))
    costs.observe_host(4, False, 0.001, after=0.0005)
    assert list(costs.host[4, True]) == [0.002, 0.002] and list(costs.host_after[4, True]) == [0.0, 0.0]
    assert costs.host_seconds(4, proposed=True) == pytest.approx((0.001, 0.0005))


def test_the_batched_loop_times_each_steady_pass_whole_its_host_seconds_apart(monkeypatch):
    """Each steady pass gives the policy its forward and its host seconds (plan, proposals, commit), and settles on
    their sum: the pass whole, drafted and undrafted alike; the texts stay plain decoding's."""
    from specfamily.core.batch_lengths import LengthPolicy

    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8, 5, 6], [10, 11, 12, 10, 11, 12], [20, 21, 22, 20]]
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=24)]
    timed, settle, seen, policies = LengthPolicy.timed, LengthPolicy.settle, [], []

    def timing(self, batch, rows, steps, draft_seconds, seconds, slots=0.0, drafted=0.0, host=None, after=0.0):
        assert 0 <= after <= host  # its commits and records, after the forward
        seen.append([rows > batch, seconds, host])
        policies.append(self)
        return timed(self, batch, rows, steps, draft_seconds, seconds, slots, drafted, host, after)

    def settling(self, committed, seconds):
        seen[-1].append(seconds)
        return settle(self, committed, seconds)

    monkeypatch.setattr(LengthPolicy, "timed", timing)
    monkeypatch.setattr(LengthPolicy, "settle", settling)
    texts = [r.tokens for r in sf.generate_batch(target, sf.create_drafter("prompt_lookup", target), prompts, 24)]
    assert texts == plain and len(seen) >= 10 and any(d for d, *_ in seen)
    for _, forward, host, whole in seen:
        assert host >= 0 and whole == pytest.approx(forward + host, abs=1e-9)
    kept = policies[0].costs.host
    assert {d for _, d in kept} == {d for d, *_ in seen}
    assert sum(len(v) for v in kept.values()) == len(seen)  # every steady pass, fewer than a window


def test_a_table_is_built_again_once_a_median_moves_and_only_then():
    """The tables are kept between passes (the plan asks the same one several times a pass): a pass that moves its
    shape's median (or measures a new shape) changes them, one that leaves every median where it was does not."""
    costs = RowCosts(refit_every=1000)
    for _ in range(5):
        costs.observe(4, 4, 0.040)
        costs.observe(4, 8, 0.048)
    before = costs.table(4, 12)
    assert before[4] == pytest.approx(0.040) and before[8] == pytest.approx(0.048)
    costs.observe(4, 4, 0.040)  # the median stays
    assert costs.table(4, 12) == before and costs._bases
    costs.observe(4, 4, 0.050)
    costs.observe(4, 4, 0.050)
    assert costs.table(4, 12) == before  # 3 of the latest 5 still at 0.040
    costs.observe(4, 4, 0.050)
    moved = costs.table(4, 12)
    assert moved[4] == pytest.approx(0.050) and moved[8] == pytest.approx(0.048)
    costs.observe(4, 6, 0.041)  # a new shape: the curve through it
    assert costs.table(4, 12)[6] == pytest.approx(0.041) and costs.reach(4) == 12


def test_the_medians_and_means_are_the_statistics_modules():
    """The bookkeeping's own median and means (cheaper each pass) give statistics' numbers exactly."""
    import random
    import statistics

    rng = random.Random(3)
    for n in (1, 2, 5, 6, 31):
        values = [rng.random() for _ in range(n)]
        assert batch_costs._median(list(values)) == statistics.median(values)
    costs = RowCosts()
    hosts = [rng.random() * 1e-3 for _ in range(40)]
    for h in hosts:
        costs.observe_host(4, False, h, h / 3)
    kept = hosts[-costs.history :]
    assert costs.host_seconds(4)[0] == statistics.fmean(kept)
    assert costs._means((4, False))[1] == statistics.fmean(h / 3 for h in kept)


def test_a_runs_costs_leave_each_shapes_first_pass_out_and_a_kept_table_does_not_again():
    """A shape's first pass pays its one-time set-up (session 37: t(4, 5) read 34 ms cold against 20 warm, and a
    plan held idle on it): ``RowCosts.of`` leaves it out, the shape seen (its reach grown), and a table kept on the
    target does not leave a shape out twice; a bare RowCosts keeps every pass."""
    target = types.SimpleNamespace(batch_pass_costs={})
    costs = RowCosts.of(target)
    costs.observe(4, 4, 0.020)
    costs.observe(4, 5, 0.034)  # cold
    assert not costs.known(4, 5) and costs.reach(4) == 9 and (4, 5) in target.batch_pass_costs
    costs.observe(4, 5, 0.021)
    costs.observe(4, 4, 0.019)
    assert costs.measured(4, 5) == pytest.approx(0.021) and costs.measured(4, 4) == pytest.approx(0.019)
    costs.observe(4, 6, 0.040)  # cold: seen, nothing kept
    costs.refit()  # a seen shape without a kept pass is no group and no median
    assert not costs.known(4, 6) and costs.reach(4) == 10 and costs.known(4, 5)
    again = RowCosts.of(target)
    assert again.measured(4, 5) == pytest.approx(0.021) and again.reach(4) == 10
    again.observe(4, 5, 0.023)  # the same process: warm, kept
    assert again.measured(4, 5) == pytest.approx(0.022)
    bare = RowCosts()
    bare.observe(4, 5, 0.034)
    assert bare.measured(4, 5) == pytest.approx(0.034)
