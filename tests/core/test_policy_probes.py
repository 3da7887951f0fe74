"""The cost-aware auto policy's probes: probes that keep losing back off, a tree's probe is capped in cost, the
stretch ledger, and when the policy plans again (the rest of the policy: test_policy.py)."""

import pytest

from specfamily.core.policy import AutoPolicy
from specfamily.core.theory import best_draft_length


def test_auto_backs_off_when_probes_lure_it_into_losing_stretches():
    """Fake costs (flat curve): each probe is accepted whole and cheap (c = 0.05), so the estimates predict a gain,
    and every pass after it accepts nothing at c = 1 (3 plain passes for 1 token) until the policy stops. Each such
    stretch loses as a whole (3 + k tokens for 1.1 + 3k passes), so the interval doubles after each one, up to
    max_probe_every, where it used to go back to probe_every whenever the policy drafted."""
    policy = AutoPolicy(2, max_gamma=2, probe_every=3, max_probe_every=48, verify_cost=1.0)
    policy.update(2, 0, 1.0, tokens=2)  # the start gamma, dear and useless: idle
    intervals, stretches = [], []
    for _ in range(8):
        while (gamma := policy.next_gamma()) == 0:
            pass
        policy.update(gamma, gamma, 0.05, tokens=gamma)  # the lure
        stretches.append(1)
        while (gamma := policy.next_gamma()) > 0:
            policy.update(gamma, 0, 1.0, tokens=gamma)
            stretches[-1] += 1
        intervals.append(policy.interval)
    assert stretches[0] > 1, stretches  # the lure is real: the probe made it draft on
    assert intervals == [6, 12, 24, 48, 48, 48, 48, 48], (intervals, stretches)


def test_auto_probes_often_again_after_a_stretch_that_paid():
    """A stretch that paid as a whole (tokens >= its cost in plain passes), even one that ends in losing passes,
    brings the interval back to probe_every."""
    policy = AutoPolicy(2, max_gamma=2, probe_every=3, verify_cost=1.0)
    policy.update(2, 0, 1.0, tokens=2)  # dear and useless: idle
    while policy.next_gamma() == 0:
        pass
    policy.interval = 24  # as after several losing probes
    policy.update(2, 2, 0.05, tokens=2)  # the probe: 3 tokens for 1.1 passes, drafting pays from here
    for _ in range(5):
        assert policy.next_gamma() == 2
        policy.update(2, 2, 0.05, tokens=2)
    losing = 0
    while policy.next_gamma():
        policy.update(2, 0, 1.0, tokens=2)  # then 1 token for 3 passes until it stops
        losing += 1
    assert 18 + losing >= 6.6 + 3 * losing  # the stretch paid as a whole
    assert losing >= 1 and policy.interval == 3


@pytest.mark.parametrize(("probe_cost", "depth"), [(1.5, 2), (2.0, 5), (10.0, 6)])
def test_auto_probes_a_tree_with_the_deepest_draft_its_probe_cost_allows(probe_cost, depth):
    """No length predicts a gain: the probe is the deepest draft up to gamma = 6 whose verification costs at most
    probe_cost plain passes (fake tree: 4 tokens a depth, 1 + 0.05 a token), never below depth 1."""
    policy = AutoPolicy(6, probe_every=2, probe_cost=probe_cost, verify_cost=lambda g: 1.0 + 0.05 * g)
    policy.update(6, 0, 1.0, tokens=24)  # a tree of 6 levels, 4 tokens each: width 4 from here
    policy.width = 4.0
    policy._choice = None
    asked = [policy.next_gamma() for _ in range(3)]
    assert asked[:1] == [0] and depth in asked, asked
    assert policy._cost(depth) <= probe_cost and (depth == 6 or policy._cost(depth + 1) > probe_cost)


def test_auto_probe_cost_caps_trees_only_never_below_depth_one_and_is_checked():
    chain = AutoPolicy(3, probe_every=1, probe_cost=1.0, verify_cost=lambda g: 2.0 + g)
    chain.update(3, 0, 0.0, tokens=3)
    assert chain.next_gamma() == 3  # a chain with free draft steps probes at its start gamma, whatever it verifies
    tree = AutoPolicy(3, probe_every=1, probe_cost=1.0, verify_cost=lambda g: 2.0 + g)
    tree.update(3, 0, 1.0, tokens=9)
    assert tree.width > 1 and tree.next_gamma() == 1
    for bad in (0.5, float("nan")):
        with pytest.raises(ValueError, match="probe_cost must be a finite number >= 1"):
            AutoPolicy(3, probe_cost=bad)


@pytest.mark.parametrize(("c", "interval", "depth"), [(0.002, 16, 10), (0.11, 16, 2), (0.11, 32, 5), (1.1, 16, 1)])
def test_a_chain_probes_as_deep_as_the_margin_pays_for_its_draft_steps(c, interval, depth):
    """No length predicts a gain: a chain's probe is the deepest up to gamma = 10 whose draft steps (c plain passes
    each) cost at most min_speedup - 1 = 0.02 plain passes a pass of the interval (0.32 at 16, 0.64 at 32), at least
    1: prompt lookup's nearly free steps still probe deep, a draft model (small_model's c ~0.11, self_spec's ~1.1)
    probes shallow until its interval has grown."""
    policy = AutoPolicy(10, probe_every=16, verify_cost=lambda g: 1.1 + 0.05 * g if g else 1.0)
    for _ in range(10):  # a chain, accepted nothing: alpha 0.1 predicts no gain at any length
        policy.update(1, 0, c / 1.15, tokens=1)
    policy.interval = interval
    asked = [policy.next_gamma() for _ in range(interval)]
    assert asked == [0] * (interval - 1) + [depth]


def test_a_stretch_is_charged_each_pass_as_timed_else_as_costed():
    """The stretch ledger charges a drafted pass its timed verification over the plain pass (when that pass was
    timed), plus its own draft steps and catch-up; untimed, the costed verification."""
    policy = AutoPolicy(2, verify_cost=1.0)
    policy.timed(0, 0.010)
    policy.timed(2, 0.030)  # this drafted pass: 3 plain passes
    assert policy._spent(2, 2, 1.0, 0.5, 0.25) == pytest.approx(3.0 * (1 + 2 * 0.5) + 3.0 * 0.25)
    assert policy._spent(2, 2, 1.2, 0.5, None) == pytest.approx(1.2 * 2)  # the timed pass is used once; no overhead
    policy.timed(4, 0.030)
    assert policy._spent(2, 2, 1.2, 0.0, 0.0) == pytest.approx(1.2)  # a time for another size is not this pass's


def _timed_run(replan: bool, passes: int = 300) -> list[int]:
    """The gammas an auto policy asks for over a run of timed passes (plain and drafted, times jittered, acceptance
    cycling); ``replan``: drop its kept choice before every pass, as it did before each plain pass was kept apart."""
    policy = AutoPolicy(4, max_gamma=8, probe_every=4, verify_cost=lambda g: 1.0 + 0.06 * g)
    gammas = []
    for i in range(passes):
        if replan:
            policy._choice = None
        gamma = policy.next_gamma()
        gammas.append(gamma)
        policy.timed(gamma, 0.010 * (1.0 + 0.08 * gamma) * (1.0 + 0.01 * (i % 7)))
        policy.update(gamma, min(gamma, (i // 5) % 4), 0.3 + 0.1 * (i % 3) if gamma else None, tokens=gamma)
    return gammas


def test_auto_decides_as_if_it_planned_before_every_pass():
    gammas = _timed_run(replan=False)
    assert gammas == _timed_run(replan=True)
    assert 0 in gammas and any(g > 0 for g in gammas[20:])  # idle stretches and drafted passes both reached


def test_an_idle_auto_policy_does_not_plan_again_after_each_plain_pass(monkeypatch):
    """A plain pass's time moves t(1) alone, which no choice reads: while the policy drafts nothing, timed plain passes
    cost it no planning; a pass that changes the measured scale (a drafted one) does."""
    import specfamily.core.policy as module

    calls = []
    monkeypatch.setattr(module, "best_draft_length", lambda *a, **k: calls.append(1) or best_draft_length(*a, **k))
    policy = AutoPolicy(4, probe_every=64, verify_cost=lambda g: 1.0 + 0.06 * g)
    policy.timed(0, 0.010)
    policy.timed(4, 0.020)
    policy.update(4, 0, 2.0, tokens=4)  # a dear draft that found nothing: no length pays
    assert policy.next_gamma() == 0
    planned = len(calls)
    for _ in range(20):
        assert policy.next_gamma() == 0
        policy.timed(0, 0.010)
        policy.update(0, 0, None, tokens=0)
    assert len(calls) == planned
    policy.timed(4, 0.030)  # the scale at 4 draft tokens moves: plan again
    policy.next_gamma()
    assert len(calls) > planned


def _probe_intervals(c: float, passes: int = 120) -> list[int]:
    """Nothing is ever accepted, a draft token costs 0.02 plain passes to verify and ``c`` to draft: the interval
    after each drafted pass of ``passes`` (the opening stretch drafted before c was known, then one probe each)."""
    policy = AutoPolicy(1, probe_every=4, max_probe_every=64, verify_cost=lambda g: 1.0 + 0.02 * g)
    intervals = []
    for _ in range(passes):
        gamma = policy.next_gamma()
        policy.update(gamma, 0, c if gamma else None, tokens=gamma)
        if gamma:
            intervals.append(policy.interval)
    return intervals


def test_a_probe_that_loses_within_the_margin_keeps_the_interval_and_a_dear_one_doubles_it_until_it_fits():
    """A one-token probe that finds nothing loses 0.02 + c plain passes. Probing every n passes may cost
    (min_speedup - 1) n = 0.02 n: at c = 0 (0.02 a probe) the policy probes every 4 passes throughout; at c = 0.2
    (0.224 a probe) the interval doubles until 0.02 n covers it (n = 16), not on up to max_probe_every."""
    cheap, dear = _probe_intervals(0.0), _probe_intervals(0.2)
    assert len(cheap) > 20 and set(cheap) == {4}, cheap
    assert dear[-6:] == [16] * 6 and sorted(set(dear)) == [4, 8, 16], dear


def test_a_probes_catch_up_is_charged_to_it_and_only_a_steady_backlog_enters_the_overhead():
    """The catch-up on the first drafted pass after plain ones (an idle stretch's backlog) is what that pass cost:
    it is charged to the probe (0.5 passes: it loses 0.545 passes, beyond the 0.08 that probing every 4 may cost, and
    the interval doubles; at 0.04 it loses 0.071 and does not) but not taken as the drafter's per-pass overhead; a
    drafted pass right after a drafted one gives that."""
    for catch_up, interval in ((0.5, 8), (0.04, 4)):
        policy = AutoPolicy(1, probe_every=4, max_probe_every=64, verify_cost=1.03)
        for _ in range(30):  # the opening stretch: nothing accepted; it ends idle
            policy.update(1, 0, 0.0, tokens=1)
        policy.update(0, 0)  # a plain pass: the next draft follows an idle stretch
        policy._stretch, policy.interval = [0.0, 0.0, 0.0], 4
        policy._probing = True
        policy.update(1, 0, 0.0, tokens=1, overhead=catch_up)
        assert policy.overhead == 0.0 and policy.interval == interval, (catch_up, policy.interval)
    policy.update(1, 1, 0.0, tokens=1)
    policy.update(1, 1, 0.0, tokens=1, overhead=0.5)  # after a drafted pass: a steady backlog
    assert policy.overhead == pytest.approx(0.3 * 0.5 * 1.03)  # smoothed, in plain passes


def test_probes_that_no_acceptance_could_make_pay_back_off_as_before():
    """c = 1.2 a draft step: even every draft accepted gives 2 tokens for 2.2 passes, so a probe can only re-measure
    c. Each such probe loses 0.2 passes, within the margin from an interval of 16 (0.32) on, and still doubles the
    interval up to max_probe_every, as it did before the margin rule (which alone stops at 16)."""
    policy = AutoPolicy(1, probe_every=4, max_probe_every=64, verify_cost=1.0)
    intervals = []
    for _ in range(400):
        gamma = policy.next_gamma()
        policy.update(gamma, gamma, 1.2 if gamma else None, tokens=gamma)  # accepted whole, and still dear
        if gamma:
            intervals.append(policy.interval)
    assert intervals[-3:] == [64, 64, 64], intervals


def test_the_second_drafted_pass_c_replaces_the_first_then_c_is_smoothed():
    """A fresh drafter's first forward is cold (eagle's head: c 0.5-0.6, then 0.08): the first drafted pass's c is
    replaced by the second's, not smoothed with it; from the third pass on c is smoothed (c_smoothing 0.3)."""
    policy = AutoPolicy(2, verify_cost=1.0, prior_alpha=1.0)  # every draft pays: no probe replaces c
    policy.update(2, 2, 0.6, tokens=2)
    assert policy.c_estimate == pytest.approx(0.6)
    policy.update(policy.next_gamma(), 2, 0.1, tokens=2)
    assert policy.c_estimate == pytest.approx(0.1)
    policy.update(policy.next_gamma(), 2, 0.2, tokens=2)
    assert policy.c_estimate == pytest.approx(0.1 + 0.3 * (0.2 - 0.1))


def _unstarted_run(replan: bool, passes: int = 400) -> tuple[list[int], list[str]]:
    """Requests of 40 passes whose first drafted pass pays a start of 1.5 plain passes (a draft model's prefill):
    the gammas asked and each request's account; ``replan``: drop the kept choice before every pass."""
    policy = AutoPolicy(4, max_gamma=8, probe_every=8, verify_cost=lambda g: 1.0 + 0.03 * g)
    gammas, notes = [], []
    for i in range(passes):
        if i % 40 == 0:
            notes.append(policy.describe())
            policy.reset()
        if replan:
            policy._choice = None
        gamma = policy.next_gamma()
        gammas.append(gamma)
        accepted = min(gamma, (i // 40) % 3)  # requests whose drafts pay and requests whose drafts do not
        start = 1.5 if gamma and not policy.started else 0.0
        policy.update(gamma, accepted, 0.08 if gamma else None, tokens=gamma, overhead=start if gamma else None)
    return gammas, notes


def test_an_unstarted_request_decides_as_if_it_planned_every_pass_at_its_start_share():
    gammas, notes = _unstarted_run(replan=False)
    assert (gammas, notes) == _unstarted_run(replan=True)
    assert 0 in gammas and sum(g > 0 for g in gammas) > 40  # idle stretches, probes and drafted requests reached


def test_an_unstarted_request_that_drafts_nothing_is_not_planned_again_each_pass(monkeypatch):
    """While a request has not drafted, its start's share grows every pass; a kept choice that drafts nothing stays
    nothing (a larger share lowers every length's speedup), so only a due probe plans again (its length reads it)."""
    import specfamily.core.policy as module

    calls = []
    monkeypatch.setattr(module, "best_draft_length", lambda *a, **k: calls.append(1) or best_draft_length(*a, **k))
    policy = AutoPolicy(4, probe_every=16, verify_cost=lambda g: 1.0 + 0.06 * g)
    policy.update(4, 0, 0.3, tokens=4, overhead=2.0)  # a first drafted pass: its start measured, nothing accepted
    policy.reset()
    policy.request_passes = 100.0  # requests run 100 passes: the start's share is 2 / the passes left
    assert policy.next_gamma() == 0  # planned: two lengths (the best over the margin, and any)
    planned = len(calls)
    asked = [policy.next_gamma() for _ in range(14)]
    assert asked == [0] * 14 and 0 < policy._start_share() and not policy.started
    assert len(calls) == planned  # before: planned again on each of these 14 passes
    assert policy.next_gamma() > 0 and len(calls) == planned + 2  # the probe planned again at its share


def test_describing_an_unstarted_request_reports_its_start_share_and_keeps_its_choice():
    """The account is planned at the start share the request has reached, but a report changes nothing: the kept
    choice (the one its later passes use) is the same object after it."""
    policy = AutoPolicy(4, probe_every=16, verify_cost=lambda g: 1.0 + 0.06 * g)
    policy.update(4, 0, 0.3, tokens=4, overhead=2.0)
    policy.reset()
    policy.request_passes = 100.0
    assert policy.next_gamma() == 0
    kept = policy._choice
    for _ in range(5):
        policy.next_gamma()
    note = policy.describe()
    assert policy._choice is kept and "predicted gain below" in note
    assert f"(best {policy._planned()[2]:.2f})" in note  # at this pass's share, not the kept choice's


def test_a_probes_timed_pass_replaces_the_slow_window_that_made_the_policy_idle():
    """Drafting pays until five drafted passes in a row run three times slower (a burst of load): the measured
    scale at their size makes every length lose and the policy idles. Its probe, timed at the normal cost, replaces
    that window (one pass would never outvote the median of five, and an idle policy drafts one pass an interval),
    so it drafts again at once; joining the window, the probe left it idle."""
    plain = 0.01

    def drafted(policy: AutoPolicy, gamma: int, seconds: float) -> None:
        policy.timed(gamma, seconds)
        policy.update(gamma, gamma, 0.05, tokens=gamma)

    policy = AutoPolicy(1, max_gamma=1, probe_every=3, verify_cost=1.0, refresh_every=1000)  # probes its size
    policy.timed(0, plain)
    for _ in range(6):
        gamma = policy.next_gamma()
        assert gamma == 1
        drafted(policy, gamma, plain)
    for _ in range(5):  # the burst: the policy drafts on until the window's median moves
        gamma = policy.next_gamma()
        if gamma == 0:
            break
        drafted(policy, gamma, 3 * plain)
    assert gamma == 0 and policy.costs.scale(1) == pytest.approx(3.0)
    while (gamma := policy.next_gamma()) == 0:
        policy.timed(0, plain)
    drafted(policy, gamma, plain)  # the probe, at the normal cost
    assert policy.costs.scale(1) == pytest.approx(1.0)
    assert policy.next_gamma() == 1


def test_a_probe_answered_with_nothing_ends_there_and_one_cut_by_the_loop_is_asked_again():
    """Idle (accepted nothing, a dear verification) yet able to pay were drafts accepted: the probe comes after the
    interval. Answered with an empty draft (the loop reports its lookup's time as c) it is over and the next waits
    an interval, charged as a pass that brought one token for 1 + c; cut by the loop (no proposal, c None) it is
    asked again on the next pass."""
    policy = AutoPolicy(1, max_gamma=1, probe_every=3, verify_cost=1.2)
    for _ in range(5):
        policy.update(1, 0, 0.05, tokens=1)
    policy.interval, policy.idle = 3, 0  # as after a stretch that paid
    assert [policy.next_gamma() for _ in range(3)] == [0, 0, 1]
    policy.update(0, 0, 0.02)  # the probe, answered with nothing
    assert policy.interval == 3 and [policy.next_gamma() for _ in range(3)] == [0, 0, 1]
    policy.update(0, 0, None)  # cut by the loop: never proposed
    assert policy.next_gamma() == 1


def test_empty_drafts_asked_for_while_drafting_are_a_cost_of_each_drafted_pass():
    """A retrieval drafter finds a match on one pass in four and one drafted token in four is accepted. Told what its
    three empty lookups between two drafted passes cost (c 0.1 each), the policy counts them in ``empty`` (0.3
    passes a drafted pass) and stops drafting (1.25 tokens for 1.32 passes); not told (c None, as before), it drafts
    on at a predicted 1.2x."""
    asked = {}
    for told in (True, False):
        policy = AutoPolicy(1, max_gamma=1, verify_cost=1.0)
        count = drafted = 0
        for _ in range(400):
            if not policy.next_gamma():
                policy.update(0, 0)
                continue
            count += 1
            if count % 4:
                policy.update(0, 0, 0.1 if told else None)
            else:
                drafted += 1
                policy.update(1, int(drafted % 4 == 0), 0.02, tokens=1)
            if told and drafted == 2:
                assert policy.empty == pytest.approx(0.3 * (1 - 0.7 ** 2))  # smoothed by c_smoothing 0.3
        asked[told] = count
    assert asked[False] == 400 and asked[True] < 100, asked
