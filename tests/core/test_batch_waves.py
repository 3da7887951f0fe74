"""A load whose last waves drafted apart and ended no sooner than plain pricing plans them jointly for a few runs."""

import pytest
import torch
from batch_clock import priced_run

from specfamily.core.batch_goodput import Realized
from specfamily.core.batch_waves import WaveLedger, judge
from specfamily.core.types import Draft
from specfamily.testing import OracleDrafter, tiny_target


def test_a_wave_that_only_ran_some_slots_ahead_came_out_below_plain():
    ledger = WaveLedger()
    for _ in range(6):
        ledger.record(1.0, 1.0, 1.0, False, False)  # plain passes: priced as measured
    for _ in range(4):
        ledger.record(1.0, 1.5, 1.0, True, True)  # drafted apart: 1.5x the seconds, the end no nearer
    assert ledger.rate() == pytest.approx(1.0 / ((6 + 4 * 1.5) / 10))
    kept = Realized()
    judge(ledger, kept)
    assert kept.waves_closed == 4


def test_a_wave_whose_drafts_brought_its_end_nearer_stays_open_and_the_yardstick_is_its_own_plain_passes():
    ledger = WaveLedger()
    for _ in range(4):
        ledger.record(1.0, 2.0, 1.0, False, False)  # plain passes measure twice their price: the yardstick
    for _ in range(4):
        ledger.record(3.0, 3.0, 1.0, True, True)  # 3 tokens of the end in 1.5x a plain pass's measured seconds
    assert ledger.rate() == pytest.approx((16 / 8) / ((8 + 12) / 8 / 2.0))
    kept = Realized(waves_closed=2)
    judge(ledger, kept)
    assert kept.waves_closed == 0


def test_a_closed_load_counts_its_runs_down_and_too_few_apart_passes_judge_nothing():
    kept = Realized(waves_closed=2)
    judge(WaveLedger(), kept)  # a run that did not draft apart (closed): one run less
    assert kept.waves_closed == 1
    ledger = WaveLedger()
    ledger.record(1.0, 1.0, 1.0, False, False)
    ledger.record(1.0, 9.0, 1.0, True, True)  # one losing apart pass: not enough to judge
    judge(ledger, kept)
    assert kept.waves_closed == 0
    ledger.record(1.0, 1.0, None, True, True)  # not priced yet: not recorded
    assert ledger.passes == 2 and WaveLedger().rate() is None


class HalfOracle(OracleDrafter):
    """The target's greedy continuation for prompts of odd length, nothing for the others."""

    def propose(self, ctx, gamma):
        return super().propose(ctx, gamma) if len(ctx.prompt_ids) % 2 else Draft.empty()


def cheap(batch: int, rows: int) -> float:
    return 1.0 + 0.01 * rows


def _runs(monkeypatch, drafter, runs: int = 2) -> list[tuple[int, int, float]]:
    """(passes, steady passes that fed a draft, the kept waves_closed after it) of ``runs`` runs of 8 requests at
    max_batch=4 on one target: a last wave from the first pass (4 wait, one a slot)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    out = []
    for _ in range(runs):
        seen = []
        priced_run(monkeypatch, cheap, lambda t: drafter(t, gamma=4, policy="auto", horizon=200), [0.0] * 8, seen,
                   max_batch=4, max_new_tokens=40, target=target)
        kept = target.batch_realized[drafter.__qualname__][4]
        out.append((len(seen), sum(s and sum(d) > 0 for _, d, s in seen), kept.waves_closed))
        monkeypatch.undo()
    return out


def test_drafts_that_only_run_some_slots_ahead_stop_in_the_next_runs_waves(monkeypatch):
    """Half the requests draft the target's own text, the others nothing: the waiting requests are admitted together
    once every slot is free (a last wave), so the slots that draft only wait for the ones that do not and the batch
    ends no sooner. The first run drafts, its wave comes out below plain pricing and closes the load; the second run
    plans jointly only: it drafts at most on its first steady pass (planned on estimates before any slot proposed;
    once the drafts are seen, the slots at the end have nothing to draft) and takes as many passes."""
    (passes, drafted, closed), (again, drafted_again, closed_again) = _runs(monkeypatch, HalfOracle)
    assert drafted >= 5 and closed == 4
    assert drafted_again <= 1 and again == passes and closed_again == 3


def test_drafts_that_bring_every_slot_nearer_keep_drafting(monkeypatch):
    (passes, drafted, closed), (again, drafted_again, closed_again) = _runs(monkeypatch, OracleDrafter)
    assert drafted >= 5 and closed == 0
    assert drafted_again >= 5 and closed_again == 0 and again < 40
