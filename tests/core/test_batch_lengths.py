"""Per-request draft lengths for the batch's goodput: t(B, N) learned from timed passes, the greedy marginal plan,
drafting where it pays for the batch and not where not, deterministic drafts planned on what they hold."""

import re

import pytest
import torch
from batch_clock import priced_run
from flawed_oracle import FlawedOracle

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.batch_goodput import behind_ends, projected_ends
from specfamily.core.batch_lengths import (
    LengthPolicy,
    Prospect,
    RowCosts,
    Tally,
    finishing,
    plan_lengths,
    proposing,
    truncated,
)
from specfamily.core.types import Draft
from specfamily.testing import tiny_target


def test_row_costs_are_medians_where_measured_and_a_curve_over_rows_elsewhere():
    costs = RowCosts(window=3)
    assert costs.table(1, 4) is None and costs.draft_step(4) == 0.0
    for seconds in (1.0, 9.0, 2.0, 3.0):  # window 3: the 1.0 is forgotten
        costs.observe(1, 1, seconds)
    assert costs.measured(1, 1) == 3.0
    assert costs.table(1, 5) is None  # one point: nothing to predict with
    costs.observe(1, 5, 7.0)
    assert costs.curve() == ([1, 5], [3.0, 7.0])
    assert costs.table(1, 7) == pytest.approx([3.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])  # flat before, slope past, to
    # the reach: B=1's largest measured pass (5 rows) plus one row a slot
    costs.observe(2, 2, 8.0)  # B=2 measures 2 rows at 8.0, where the curve said 4.0: now a point of it
    assert costs.curve() == ([1, 2, 5], [3.0, 8.0, 7.0])
    assert costs.table(2, 3)[2:] == pytest.approx([8.0, 8.0 - 1 / 3])
    costs.observe(3, 5, 14.0)  # B=3 at 5 rows: twice B=1's; the curve takes the median, B=3 its own scale
    assert costs.curve()[1][2] == 10.5
    assert costs.table(3, 6)[5:] == pytest.approx([14.0, (10.5 + 2.5 / 3) * 14.0 / 10.5])
    assert len(costs.table(3, 100)) == 5 + 3 + 1  # priced to B=3's largest measured pass plus a row a slot
    assert costs.reach(3) == 8 and costs.reach(4) == 8  # a batch size measured nowhere: its plain pass plus one
    costs.observe(3, 3, -1.0)  # not a time: ignored
    assert not costs.known(3, 3)
    costs.observe_draft(2, 4, 2.0)
    assert costs.draft_step(2) == 0.5 and costs.draft_step(4) == 1.0  # a looping drafter: scaled by the batch


def test_prospects_and_truncated_drafts():
    assert Prospect.planned([0.9, 0.8, 0.7], 1.0, 2) == Prospect([0.9, 0.8], [1, 1])
    assert Prospect.planned([0.9, 0.8, 0.7], 2.5, 3) == Prospect([0.9, 0.8, 0.7], [3, 2, 3])
    tree = Draft(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, 0, -1, 1, 2]))  # depths 1, 2, 1, 3, 2
    assert Prospect.seen([0.5] * 8, tree) == Prospect([0.5] * 3, [2, 2, 1])
    assert Prospect.seen([0.5] * 8, Draft.empty()) == Prospect((), ())
    cut = truncated(tree, 2)
    assert cut.tokens.tolist() == [5, 6, 7, 9] and cut.parents.tolist() == [-1, 0, -1, 2]
    assert truncated(tree, 3) is tree and len(truncated(tree, 0)) == 0
    assert truncated(Draft.chain([1, 2, 3]), 1).tokens.tolist() == [1]
    assert proposing([0.8, 0.5], 0.25) == [0.2, 0.5] and proposing([], 0.5) == []


def test_a_tally_counts_levels_tried_and_accepted_over_a_prior():
    tally = Tally()
    tally.add(3, 1)  # three levels verified, the first accepted
    tally.add(1, 1)
    assert tally.tried == [2, 1, 1] and tally.accepted == [2, 0, 0]
    assert tally.alpha([0.5, 0.5, 0.5, 0.5], 2.0) == pytest.approx([3 / 4, 1 / 3, 1 / 3, 0.5])  # depth 4: the prior
    assert Tally().alpha([0.7], 4.0) == pytest.approx([0.7])


def test_the_plan_is_the_best_prefix_in_the_order_of_gain():
    """Two requests at B=2: one accepts 0.9 at every depth, one 0.3. A pass costs 1 s plus 0.1 s a row from the
    fourth row on; the sure request's first levels pay, the doubtful one's do not (0.3 gains less than the 0.1 s a
    row costs at ~3 tokens a second) and a request with nothing to propose costs nothing."""
    seconds = [1.0 + 0.1 * max(0, n - 3) for n in range(40)]
    lengths, gain = plan_lengths([Prospect([0.9] * 8, [1] * 8), Prospect([0.3] * 8, [1] * 8)], seconds, 0.0)
    rates = {g: (2 + sum(0.9**d for d in range(1, g + 1))) / seconds[2 + g] for g in range(9)}
    best = max(rates, key=rates.get)
    assert lengths == [best, 0] and best >= 3 and gain == pytest.approx(rates[best] / rates[0])
    assert plan_lengths([Prospect([0.9] * 8, [1] * 8), Prospect((), ())], seconds, 0.0)[0] == [best, 0]
    steep = [float(max(n, 1)) for n in range(40)]  # every row costs what a request's plain row does: nothing pays
    assert plan_lengths([Prospect([0.9] * 8, [1] * 8)] * 2, steep, 0.0) == ([0, 0], 1.0)
    assert plan_lengths([Prospect([0.9] * 8, [1] * 8)] * 2, steep, 0.0, drafted=True)[0] == [1, 0]  # a probe


def test_a_finishing_batch_drafts_only_for_its_longest_requests():
    """No request waits: the batch ends with its longest request, so a shorter one's drafts buy the batch nothing.
    With rows that pay (a flat cost) every request drafts while requests wait; finishing, only the ones with the
    most tokens left (ties all count), and a request valued 0 drafts nothing even alone."""
    seconds = [1.0] * 40
    sure = Prospect([0.9] * 4, [1] * 4)
    assert plan_lengths([sure] * 3, seconds, 0.0)[0] == [4, 4, 4]
    valued = finishing([sure] * 3, [20, 7, 20])
    assert [p.value for p in valued] == [0.5, 0.0, 0.5]  # the tied longest share the batch's end
    assert plan_lengths(valued, seconds, 0.0)[0] == [4, 0, 4]
    lengths, gain = plan_lengths(finishing([sure, sure], [3, 9]), seconds, 0.0)
    assert lengths == [0, 4] and gain == pytest.approx(1 + sum(0.9**d for d in range(1, 5)))  # tokens of 1 request
    assert plan_lengths([Prospect([0.9] * 4, [1] * 4, value=0.0)], seconds, 0.0) == ([0], 1.0)
    policy = LengthPolicy()
    policy.timed(2, 2, 0, 0.0, 1.0)  # t(2, N) measured flat: before a curve exists, one level for the valued only
    assert policy.lengths(finishing([sure, sure], [9, 2])) == [1, 0]


def test_generate_batch_drafts_for_every_request_while_many_wait_then_for_the_slots_that_end_last(monkeypatch):
    """12 requests at max_batch 4 with a flat cost (drafting pays): while more requests wait than one a slot, requests
    with fewer tokens left draft too; in the last wave (at most one waiting a slot), further than two drafts from its
    end, the slots tied at the latest end draft (each slot valued by its odds of ending last); near the end the slots
    projected to end last draft to one depth k together, and a slot b passes behind them drafts k - b levels (none
    from k <= b): levels that would end it no sooner than a slot that stays put are never drafted
    (``plan_together``). Greedy texts."""
    states = []  # per pass: (waiting requests in the last wave or None, each slot's tokens left)
    step = batch_loop._Batch._step

    def recorded(self):
        states.append((self.wave, [self.budget - len(r.new_tokens) for r in self.live]))
        return step(self)

    monkeypatch.setattr(batch_loop._Batch, "_step", recorded)
    drafter_of = lambda target: FlawedOracle(target, gamma=4, policy="auto", horizon=96)  # noqa: E731
    _, seen = priced_run(monkeypatch, flat, drafter_of, [0.0] * 12, max_batch=4, max_new_tokens=24)
    assert len(states) == len(seen)
    shorter = {True: 0, False: 0}  # drafted passes in which a slot with fewer tokens left than another drafted
    drafted = {True: 0, False: 0}
    waves, keeping_pace, far = set(), 0, 0
    for (wave, left), (_, lengths, steady) in zip(states, seen, strict=True):
        if steady and any(lengths):
            last = wave is not None
            drafted[last] += 1
            shorter[last] += any(g and n < max(left) for g, n in zip(lengths, left, strict=True))
            if last:
                waves.add(wave)
                behind = behind_ends(left, wave, 24)
                if max(projected_ends(left, wave, 24)) > 2 * 4:  # far from the end: each slot by its odds
                    far += 1
                    assert all(g for g, b in zip(lengths, behind, strict=True) if b == 0)  # the tied ones draft
                    continue
                k = max(lengths)
                assert {g for g, b in zip(lengths, behind, strict=True) if b == 0} == {k}  # together
                assert lengths == [min(max(0, k - b), n - 1) for b, n in zip(behind, left, strict=True)]
                keeping_pace += any(0 < b < k for b in behind)
    assert drafted[False] >= 5 and shorter[False] >= 3  # while many requests wait, every request's tokens count
    assert drafted[True] >= 3 and 0 in waves and len(waves) >= 2  # in the last wave, the slots that end last
    assert keeping_pace >= 1  # and slots just behind them, to keep pace (joint plans: only the last 2 drafts' passes)
    assert far >= 1  # further from the end, the slots tied at the latest end draft, whatever the others do


def test_a_step_in_the_cost_does_not_stop_the_plan_short():
    """Rows cost in chunks of 16 (a kernel's panel): the 17th row costs a jump that later rows share; the plan looks
    past the jump instead of stopping at the first level that does not pay on its own."""
    seconds = [1.0 if n <= 16 else 1.6 for n in range(80)]
    lengths, _ = plan_lengths([Prospect([0.97] * 16, [1] * 16)] * 4, seconds, 0.0)
    assert sum(lengths) + 4 > 16  # past the jump: at 1.6 s the 4 * 16 rows gain far more than 60%


def _drive(policy: LengthPolicy, batch: int, cost, passes: int, alpha: float = 0.9, depths: int = 6) -> list[int]:
    """Ask ``policy`` for ``passes`` passes at ``batch`` requests, timing each with cost(B, N); rows drafted."""
    drafted = []
    for _ in range(passes):
        lengths = policy.lengths([Prospect.planned([alpha] * depths, 1.0, depths)] * batch)
        rows = batch + sum(lengths)
        policy.timed(batch, rows, max(lengths), 0.001 * sum(lengths), cost(batch, rows))
        drafted.append(sum(lengths))
    return drafted


def steep(batch: int, rows: int) -> float:
    """A pass costs 1 plus a term quadratic in the rows fed: a few rows are free, dozens are not."""
    return 1.0 + 0.02 * rows**2


def flat(batch: int, rows: int) -> float:
    return 1.0


def test_with_a_steep_cost_it_drafts_alone_and_stops_drafting_under_load():
    policy = LengthPolicy()
    alone = _drive(policy, 1, steep, 60)
    loaded = _drive(policy, 16, steep, 60)
    assert alone[:2] == [0, 1]  # a plain pass first, then one level (nothing predicts a drafted pass yet)
    assert sum(r > 0 for r in alone[2:]) >= 50 and max(alone) >= 3
    assert loaded[0] == 0 and sum(r == 0 for r in loaded) >= 54  # at most a few probes
    assert "B=1: 60 passes" in policy.describe() and "B=16: 60 passes" in policy.describe()


def test_with_a_flat_cost_it_keeps_drafting_at_every_load():
    policy = LengthPolicy()
    for batch in (1, 8, 32):
        drafted = _drive(policy, batch, flat, 40)
        assert sum(r > 0 for r in drafted) >= 37  # the plain first pass and the refreshes aside
        assert max(drafted) >= 5 * batch  # cheap rows: every request drafts deep


def test_probes_at_a_load_that_keeps_losing_get_rarer():
    policy = LengthPolicy(probe_every=4, max_backoff=2)
    drafted = _drive(policy, 16, steep, 80)
    probes = [i for i, r in enumerate(drafted) if r > 0]
    assert probes[:2] == [1, 5]  # the exploring pass; the first probe on the 4th pass that did not draft
    gaps = [b - a for a, b in zip(probes[1:], probes[2:], strict=False)]
    assert gaps == [8, 16, 16, 16, 16]  # then every 8th, then every 16th pass = 4 * 2**max_backoff
    assert policy.losing[16] == len(probes) - 1


def test_a_probe_that_pays_resets_the_backoff():
    policy = LengthPolicy(probe_every=4)
    _drive(policy, 16, steep, 40)
    assert policy.losing[16] >= 2
    policy.costs = RowCosts()  # the load's cost as measured anew: flat, so drafting pays again
    policy.timed(16, 16, 0, 0.0, 1.0)
    policy.timed(16, 32, 1, 0.0, 1.0)
    assert sum(policy.lengths([Prospect.planned([0.9] * 6, 1.0, 6)] * 16)) > 0
    assert policy.losing[16] == 0 and policy.idle[16] == 0


@pytest.mark.parametrize("cost", [steep, flat])
def test_generate_batch_plans_each_requests_length_from_what_its_passes_cost(monkeypatch, cost):
    """Request 0 runs alone, then 7 arrive together: with the steep cost it drafts alone and decodes plainly at B=7
    (but for probes); with the flat one it drafts at both. The texts are greedy's."""
    drafter_of = lambda target: FlawedOracle(target, gamma=4, policy="auto", horizon=96)  # noqa: E731
    results, seen = priced_run(monkeypatch, cost, drafter_of, [0.0] + [1000.0] * 7)
    alone = [sum(d) for batch, d, steady in seen if batch == 1 and steady]
    loaded = [d for batch, d, steady in seen if batch == 7 and steady]
    assert len(alone) >= 8 and len(loaded) >= 8
    assert sum(r > 0 for r in alone) >= len(alone) - 2  # drafted alone (a plain first pass, a refresh)
    if cost is steep:
        assert sum(sum(d) == 0 for d in loaded) >= len(loaded) - 3  # plain under load, but for exploring passes
    else:
        # nothing waits for a slot: the longest requests draft (batch_lengths.finishing), down to the budget's end
        assert sum(sum(d) > 0 for d in loaded) >= len(loaded) - 3
    note = results[0].metrics.policy_note
    assert note.startswith("draft lengths per request by goodput: B=1:")  # what planned the drafts
    assert "the batch's length policy decided every pass" in note and "drafted in" not in note
    assert re.search(r"proposed in \d+ of the \d+ passes it was asked to, acceptance at depths 1-4 \[0\.\d\d", note)
    prefills = [max(d) for batch, d, steady in seen if not steady]
    assert prefills == [0, 0]  # the two prefill passes drafted nothing


@pytest.mark.parametrize("cost", [steep, flat])
def test_the_decision_is_what_the_plan_then_does_and_records_nothing(cost):
    """The batched loop asks ``decision`` on each slot's longest chain before proposing under lookahead: whether it
    drafts is whether ``lengths`` on the same prospects drafts (a probe included), and asking changes nothing the
    plan keeps (idle counts, back-off, choices, the pending prediction)."""
    policy = LengthPolicy(probe_every=4, max_backoff=2)
    chains = [Prospect([0.9] * 6, [1] * 6)] * 16

    def kept():
        return (
            dict(policy.idle),
            dict(policy.losing),
            {b: list(c) for b, c in policy.choices.items()},
            policy.predicted,
        )

    twin = LengthPolicy(probe_every=4, max_backoff=2)  # records its decision as made (``decided``), not anew
    answers = []
    for _ in range(60):
        before = kept()
        answer, decided = any(policy.decision(chains)[0]), twin.decision(chains)
        assert kept() == before
        lengths = policy.lengths(chains, proposed=True)
        assert answer == any(lengths) and twin.lengths(chains, True, decided=decided) == lengths
        answers.append(answer)
        rows = 16 + sum(lengths)
        for each in (policy, twin):
            each.timed(16, rows, max(lengths), 0.0, cost(16, rows))
            each.settle([1 + min(g, 1) for g in lengths], cost(16, rows))
        assert (twin.idle, twin.losing, twin.choices, twin.predicted) == kept()
    if cost is steep:
        assert 3 <= sum(answers) <= 12  # the exploring pass and the probes, backing off
    else:
        assert sum(answers) >= 55


def test_cheap_deterministic_drafts_are_proposed_whole_then_cut_to_the_plan(monkeypatch):
    """Prompt lookup proposes for free on the fake clock and deterministically: after its first drafted pass the
    loop asks every request for its longest draft and cuts each to its planned length, so a request without a match
    feeds its root alone while the others draft (a repeating prompt matches, a random one rarely does)."""
    proposed = []
    own = batch_loop.propose_batch

    def spy(prototype, drafters, ctxs, gammas):
        drafts = own(prototype, drafters, ctxs, gammas)
        proposed.append((list(gammas), [len(d) for d in drafts]))
        return drafts

    monkeypatch.setattr(batch_loop, "propose_batch", spy)
    seen = []
    priced_run(
        monkeypatch, lambda b, n: 1.0 + 0.01 * n, lambda t: sf.create_drafter("prompt_lookup", t), [0.0] * 4, seen
    )
    steady = [d for batch, d, s in seen if s and batch == 4]
    assert any(0 in d and max(d) > 0 for d in steady)  # one request fed its root alone beside drafting ones
    cut = [(g, n) for g, n in proposed if len(set(g)) == 1 and g[0] > 1]  # asked for the longest, all alike
    assert cut, "the loop never proposed at full length"


def test_pass_costs_are_kept_on_the_target_across_runs():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    assert target.batch_pass_costs == {} and not RowCosts.of(target).known(3, 3)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 64, (4 + i,), generator=gen).tolist() for i in range(3)]
    drafter = FlawedOracle(target, gamma=3, policy="auto", horizon=32)
    sf.generate_batch(target, drafter, prompts, max_new_tokens=12)
    assert RowCosts.of(target).known(3, 3)  # the next run (another drafter) starts from what this one measured
    assert all(isinstance(b, int) and isinstance(n, int) for b, n in target.batch_pass_costs)
    assert not RowCosts.of(object()).passes  # a target without the attribute: the run's own costs
    drafter = object()
    RowCosts.of(target, drafter).observe_draft(3, 2, 0.4)
    assert RowCosts.of(target, drafter).draft_step(3) == pytest.approx(0.2)  # a step kept per drafter class
    assert RowCosts.of(target).draft_step(3) == 0.0  # no drafter named: the run's own steps
