"""A drafter at lengths of its own drafts under load only while its drafted passes beat its plain ones."""

import torch
from batch_clock import FakeClock, priced_run

import specfamily as sf
import specfamily.core.loop as loop
from specfamily.core.batch_gate import LoadGate, gated, gated_alone, kept_gate
from specfamily.testing import OracleDrafter, tiny_target
from specfamily.testing.depth import DepthRecorder


def test_the_gate_measures_a_plain_pass_then_drafts_and_closes_where_drafts_lose():
    gate = LoadGate(probe_every=4, max_backoff=1, probe_share=1.0)  # probes paced by their back-off alone
    own = [3, 3]
    assert gate.lengths(own) == [0, 0]  # nothing measured at B=2: a plain pass first
    gate.record(2, False, 2, 1.0)
    assert gate.lengths(own) == own  # no drafted pass measured yet
    gate.record(2, True, 3, 2.0)  # 1.5 tokens a second against 2: closed
    assert [gate.lengths(own) for _ in range(2)] == [[0, 0]] * 2
    for _ in range(3):
        gate.record(2, False, 2, 1.0)
    assert gate.lengths(own) == own  # the fourth idle pass: a probe
    gate.record(2, True, 3, 2.0)  # lost again: the next probe after 8 idle passes
    assert gate.windows[2].losing == 1
    for _ in range(7):
        assert gate.lengths(own) == [0, 0]
        gate.record(2, False, 2, 1.0)
    assert gate.lengths(own) == own
    gate.record(2, True, 40, 1.0)  # drafts that pay reopen it
    assert gate.windows[2].losing == 0 and gate.lengths(own) == own
    assert gate.lengths([3, 3, 3]) == [0, 0, 0]  # another batch size: its own measurements


def test_a_probe_dearer_than_plain_passes_waits_until_its_extra_seconds_are_a_share_of_theirs():
    """A drafted pass of 11 s against plain passes of 1 s: 10 s extra, at most 5% of the plain passes between probes,
    so the next probe after 200 of them (its back-off alone would probe after 4)."""
    gate = LoadGate(probe_every=4, probe_share=0.05)
    gate.record(2, False, 2, 1.0)
    gate.record(2, True, 3, 11.0)
    assert gate.interval(gate.windows[2]) == 200
    for _ in range(199):
        assert gate.lengths([3, 3]) == [0, 0]
        gate.record(2, False, 2, 1.0)
    assert gate.lengths([3, 3]) == [3, 3]
    cheap = LoadGate(probe_every=4, probe_share=0.05)
    cheap.record(2, False, 2, 1.0)
    cheap.record(2, True, 2, 1.1)  # 0.1 s extra: 2 passes' share, so the back-off's 4
    assert cheap.interval(cheap.windows[2]) == 4


def test_a_pass_that_prefills_drafts_only_where_the_gate_is_open():
    gate = LoadGate()
    assert not gate.opens(2)  # nothing measured
    gate.record(2, False, 2, 1.0)
    gate.record(2, True, 6, 1.0)
    assert gate.opens(2) and not gate.opens(3)
    gate.record(2, True, 1, 10.0)
    assert not gate.opens(2)  # drafts lose now: no probe on a prefill


def test_a_plain_pass_is_measured_again_every_refresh_every_drafted_passes():
    gate = LoadGate(refresh_every=3)
    gate.record(2, False, 2, 1.0)
    for _ in range(3):
        assert gate.lengths([2, 2]) == [2, 2]
        gate.record(2, True, 6, 1.0)
    assert gate.lengths([2, 2]) == [0, 0]
    gate.record(2, False, 2, 1.0)
    assert gate.lengths([2, 2]) == [2, 2]


def test_only_a_drafter_at_lengths_of_its_own_by_default_is_gated():
    target = sf.load_target("zoo:code-target")
    assert gated(sf.create_drafter("lookahead", target))  # constant by design
    assert gated(sf.create_drafter("merge", target, parts=["prompt_lookup", "suffix"]))  # its parts' policies
    assert not gated(sf.create_drafter("lookahead", target, gamma=2))  # a length a user chose
    assert not gated(sf.create_drafter("prompt_lookup", target))  # cost-aware: the length policy plans it
    assert not gated(sf.create_drafter("prompt_lookup", target, gamma=3))
    assert not gated(OracleDrafter(target, gamma=4)) and not gated(None)  # no config: a test's or a user's class
    lookahead = sf.create_drafter("lookahead", target)
    assert gated(DepthRecorder(lookahead)) and not gated(DepthRecorder(lookahead, gamma=3))  # the kit's pinned length
    merge = sf.create_drafter("merge", target, parts=["prompt_lookup", "suffix"])
    assert gated_alone(lookahead) and not gated_alone(merge)  # at batch 1 merge's parts weigh their own costs
    assert not gated_alone(sf.create_drafter("lookahead", target, gamma=2)) and not gated_alone(None)


class Costly(OracleDrafter):
    """Drafts its own constant lengths by default, like lookahead decoding (a config with neither set)."""

    def __init__(self, target=None):
        super().__init__(target, gamma=4)
        self.config = type("Config", (), {"gamma": None, "policy": None})()


def test_drafts_that_cost_more_than_they_commit_stop_and_are_probed(monkeypatch):
    """Every draft accepted, but a pass costs the square of its rows: a drafted pass at B=4 commits 5 times a plain
    pass's tokens for 25 times its seconds; the gate closes after measuring both and drafts only in probes, the
    texts greedy's (``priced_run``). At nearly free rows it stays open."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)

    def steady_drafted(cost) -> tuple[int, int]:
        seen = []
        priced_run(monkeypatch, cost, lambda t: Costly(t), [0.0] * 4, seen, max_batch=4, max_new_tokens=40,
                   target=target)
        monkeypatch.undo()
        steady = [d for b, d, s in seen if s and b == 4]
        return len(steady), sum(sum(d) > 0 for d in steady)

    steady, drafted = steady_drafted(lambda batch, rows: rows * rows / 16.0)
    assert steady >= 20 and 1 <= drafted <= 3  # the first measurement, then probes only
    gate = kept_gate(target, Costly())
    assert gate.closed(gate.windows[4])
    target.batch_realized.clear()
    steady, drafted = steady_drafted(lambda batch, rows: 1.0 + 0.01 * rows)
    assert drafted >= steady - 2  # a plain pass first (and a refresh), the rest drafted


def test_a_newcomer_s_pass_drafts_only_where_the_gate_is_open(monkeypatch):
    """Six requests through four slots (admissions beside drafting slots): where drafted passes lose (a pass costs
    the square of its rows) no pass that prefills a newcomer drafts; where they win and the gate is open (a run
    after one that measured it), such passes draft."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)

    def prefill_drafts(cost) -> list[int]:
        seen = []
        priced_run(monkeypatch, cost, lambda t: Costly(t), [0.0] * 6, seen, max_batch=4, max_new_tokens=30,
                   target=target)
        monkeypatch.undo()
        return [sum(d) for b, d, steady in seen if not steady]

    dear = lambda batch, rows: rows * rows / 16.0  # noqa: E731
    assert len(prefill_drafts(dear)) >= 2 and not any(prefill_drafts(dear))
    target.batch_realized.clear()
    cheap = lambda batch, rows: 1.0 + 0.01 * rows  # noqa: E731
    assert not any(prefill_drafts(cheap)[:1])  # the first pass: nothing measured at B=4 yet
    assert any(prefill_drafts(cheap))


class Fruitless(Costly):
    """Asked for drafts, proposes none (lookahead's window fed while its pool matches nothing, without the rows)."""

    def propose(self, ctx, gamma):
        return sf.Draft.empty()


def test_a_pass_that_asked_for_drafts_is_a_drafted_pass_whatever_came_back(monkeypatch):
    """Passes that asked and got nothing commit what plain passes commit: recorded as drafted, they close the gate
    (recorded as neither, nothing ever measured the drafted side and every pass kept asking)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    seen = []
    results, _ = priced_run(monkeypatch, lambda batch, rows: 1.0 + 0.01 * rows, lambda t: Fruitless(t), [0.0] * 4,
                            seen, max_batch=4, max_new_tokens=40, target=target)
    gate = kept_gate(target, Fruitless())
    assert len(gate.windows[4].drafted) >= 1 and gate.closed(gate.windows[4])
    assert "load gate: B=4 closed, probes every " in results[-1].metrics.policy_note  # said in the batched results too


class OneSlotOracle(Costly):
    """The target's own continuation for the request with the shortest prompt, a wrong one for the others: drafts
    that only one slot accepts."""

    def propose(self, ctx, gamma):
        draft = super().propose(ctx, gamma)
        return draft if len(ctx.prompt_ids) == 3 else sf.Draft.chain([(t + 1) % 64 for t in draft.tokens.tolist()])


def test_in_a_last_wave_drafts_that_only_run_one_slot_ahead_do_not_open_the_gate(monkeypatch):
    """Two requests in two slots (a last wave from the start): one slot accepts every draft and runs ahead, the other
    accepts none and ends the batch. By committed tokens a drafted pass brings 6 for 1.6 s against a plain pass's 2
    for 1.2 s, and the gate stayed open; by the batch's projected end it brings 2 (the trailing slot's one token
    each), so drafting loses and only probes draft. A batch whose slots all accept still drafts
    (``test_drafts_that_cost_more_than_they_commit_stop_and_are_probed``)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    seen = []
    priced_run(monkeypatch, lambda batch, rows: 1.0 + 0.1 * rows, lambda t: OneSlotOracle(t), [0.0] * 2, seen,
               max_batch=2, max_new_tokens=40, target=target)
    steady = [d for b, d, s in seen if s and b == 2]
    assert len(steady) >= 20 and 1 <= sum(sum(d) > 0 for d in steady) <= 3, steady
    gate = kept_gate(target, OneSlotOracle())
    assert gate.closed(gate.windows[2]) and max(t for t, _ in gate.windows[2].drafted) == 2.0


def test_a_batch_size_not_drafted_at_goes_by_a_losing_one_no_more_than_near_times_fuller():
    """B=15 and B=12 after B=16 lost (a drafted pass 10 s against 1 s): closed from their first measured plain pass,
    probed at B=16's pace (9 s extra at most 1% of the plain passes': 900 of them); B=8 (16 is twice as full) and
    B=4 (drafts paid at B=2) draft to measure; B=24 goes by B=16 (drafts lose more the fuller the batch)."""
    gate = LoadGate(probe_share=0.01)
    gate.record(16, False, 16, 1.0)
    assert gate.lengths([2] * 16) == [2] * 16  # nothing drafted at any batch size: drafts to measure
    gate.record(16, True, 20, 10.0)
    for batch in (15, 12, 24):
        assert gate.lengths([2] * batch) == [0] * batch  # a plain pass to measure against first
        gate.record(batch, False, batch, 1.0)
        assert gate.lengths([2] * batch) == [0] * batch  # B=16's verdict
        assert gate.lost_near(batch) is gate.windows[16]
    assert gate.interval(gate.lost_near(15)) == 900
    gate.record(8, False, 8, 1.0)
    assert gate.lost_near(8) is None and gate.lengths([2] * 8) == [2] * 8
    gate.record(2, False, 2, 1.0)
    gate.record(2, True, 6, 1.0)  # drafts pay at B=2
    gate.record(4, False, 4, 1.0)
    assert gate.lost_near(4) is None and gate.lengths([2] * 4) == [2] * 4
    gate.record(4, True, 4, 3.0)  # and lose at B=4: B=3 goes by it, B=2 by its own passes
    assert gate.lost_near(3) is gate.windows[4] and gate.lengths([2] * 2) == [2] * 2
    gate.record(3, False, 3, 1.0)
    assert gate.lengths([2] * 3) == [0] * 3


def test_a_batch_that_grows_and_shrinks_does_not_explore_each_size_where_drafts_lost(monkeypatch):
    """Four requests arriving a second apart through slots of B=1, 4 and 3 (a pass costs the square of its rows /
    16): drafting lost at B=1, so B=4 and B=3 never draft (each drafted once to measure before, B=4's costing 100
    plain passes); the texts greedy's (``priced_run``)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    seen = []
    priced_run(monkeypatch, lambda batch, rows: rows * rows / 16.0, lambda t: Costly(t), [0.0, 1.0, 2.0, 3.0], seen,
               max_new_tokens=40, target=target)
    steady = [(b, sum(d) > 0) for b, d, s in seen if s]
    assert {b for b, _ in steady} == {1, 3, 4} and [b for b, drafted in steady if drafted] == [1]
    gate = kept_gate(target, Costly())
    assert gate.closed(gate.windows[1]) and not gate.windows[4].drafted and not gate.windows[3].drafted


def batch_one_run(monkeypatch, cost, drafter, target, prompt, max_new_tokens=40, notes=None) -> list[tuple[bool, int]]:
    """``sf.generate`` on a fake clock where a target pass over n fed rows costs ``cost(n)`` seconds: (steady, draft
    length) of every pass, the result's policy note appended to ``notes``; the text is greedy's."""
    clock, seen = FakeClock(), []
    monkeypatch.setattr(loop, "device_clock", lambda device: clock.now)
    monkeypatch.setattr(loop, "_planning_clock", lambda device: None)  # the pass's cost read on the fake clock too
    forward = type(target).forward

    def priced(self, pending, draft=None, features=False):
        fed = 0 if draft is None else len(draft)
        seen.append((pending.numel() == 1, fed))
        clock.t += cost(pending.numel() + fed)
        return forward(self, pending, draft, features)

    monkeypatch.setattr(type(target), "forward", priced)
    result = sf.generate(target, drafter, prompt, max_new_tokens=max_new_tokens)
    monkeypatch.undo()
    assert result.tokens == sf.generate(target, None, prompt, max_new_tokens=max_new_tokens).tokens
    if notes is not None:
        notes.append(result.metrics.policy_note)
    return seen


def test_at_batch_one_drafts_that_cost_more_than_they_commit_stop_and_are_probed(monkeypatch):
    """``sf.generate`` gates a drafter at lengths of its own as the batched loop does, at batch size 1 (lookahead at
    its defaults lost 13% under sampling there: docs/batching.md): every draft accepted, but a pass costs the square
    of its rows, so a drafted pass commits 5 tokens for 25 plain passes' seconds. A plain pass is measured first,
    then a drafted one, and after that only probes draft; at nearly free rows nearly every pass drafts."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    notes = []
    seen = batch_one_run(monkeypatch, lambda rows: rows * rows, Costly(target), target, [5, 9, 2], notes=notes)
    steady = [fed for is_steady, fed in seen if is_steady]
    assert seen[0] == (False, 0)  # the prompt's pass: nothing measured at batch 1, no draft beside it
    assert steady[:2] == [0, 4] and len(steady) >= 30 and sum(fed > 0 for fed in steady) <= 3
    gate = kept_gate(target, Costly())
    assert gate.closed(gate.windows[1]) and set(gate.windows) == {1}
    assert notes[-1].startswith("load gate: B=1 closed, probes every ")  # a default that switched itself off says so
    target.batch_realized.clear()
    seen = batch_one_run(monkeypatch, lambda rows: 1.0 + 0.01 * rows, Costly(target), target, [5, 9, 2])
    steady = [fed for is_steady, fed in seen if is_steady]
    assert sum(fed > 0 for fed in steady) >= len(steady) - 2  # a plain pass first (and a refresh), the rest drafted
    again = batch_one_run(monkeypatch, lambda rows: 1.0 + 0.01 * rows, Costly(target), target, [7, 1, 3], notes=notes)
    assert notes[-1].startswith("load gate: B=1 open (drafted passes ")
    assert again[0][1] > 0  # open at batch 1 now: the next request's prompt pass drafts too


def test_at_batch_one_a_drafter_the_loop_plans_or_a_user_fixed_is_not_gated(monkeypatch):
    """A length a user chose (gamma given) drafts on every pass however dear its rows; no gate is kept for it."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    fixed = OracleDrafter(target, gamma=4)
    notes = []
    seen = batch_one_run(monkeypatch, lambda rows: rows * rows, fixed, target, [5, 9, 2], notes=notes)
    assert all(fed > 0 for _, fed in seen[1:-1]) and "load gate" not in notes[0]
    assert [kind for kind, _ in target.batch_realized] == ["policy"]  # its policy, continued by the next of its class
