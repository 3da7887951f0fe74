"""batch_plans' priced runs on a tiny target: the oracle replays the model's greedy passes exactly (no timing
claims)."""

from __future__ import annotations

import pytest
import torch

import specfamily as sf
from specfamily.testing import tiny_target


@pytest.fixture
def plans(benchmark_module):
    return benchmark_module("batch_plans")


@pytest.mark.parametrize("gamma", [None, 2])
def test_the_oracle_replays_the_models_passes_and_plans(plans, tmp_path, gamma):
    """Prompt lookup over repetitive prompts, 6 requests at max_batch 3, on a priced clock: with the oracle in
    place of the model every request's text, the batched passes, the rows fed and the priced seconds equal the
    model's run, and drafts were fed (the replay is of drafted passes, not only plain ones)."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    prompts = [(torch.randint(0, 64, (4,), generator=gen).tolist() * 4)[: 9 + i] for i in range(6)]
    table = plans.Priced({b: {b: 0.01 * b, b + 40: 0.02 * b} for b in range(1, 4)}, {1: 0.01, 40: 0.05})
    oracle = plans.oracle_of(target, prompts, 3, 24, str(tmp_path / "texts.json"))

    def drafter():  # each run learns from nothing (the target keeps pass costs and realized windows across runs)
        target.batch_pass_costs.clear()
        target.batch_realized.clear()
        return sf.create_drafter("prompt_lookup", target, **({} if gamma is None else {"gamma": gamma}))

    model = plans.priced_run(target, drafter(), prompts, 3, 24, table)
    replay = plans.priced_run(target, drafter(), prompts, 3, 24, table, oracle)
    plain = [r.tokens for r in sf.generate_batch(target, None, prompts, 24, max_batch=3)]
    assert [r.tokens for r in replay[0]] == [r.tokens for r in model[0]] == plain
    assert replay[1:4] == model[1:4] and replay[4] == pytest.approx(model[4])
    assert replay[3] > replay[2]  # rows past one a slot: drafts were fed
    assert plans.oracle_of(target, prompts, 3, 24, str(tmp_path / "texts.json")).texts == oracle.texts  # read back


def test_a_pass_is_priced_at_its_slots_contexts(plans):
    """With the table measured at 100 and 700 cached tokens a slot, a pass is priced linearly in its slots' cached
    tokens and its draft rows' (a table made from such a cost gives it back exactly); without the far table, the
    near one alone whatever the contexts; the JSON round trip keeps both."""

    def cost(batch, rows, context):
        return 0.040 + 0.001 * rows + 5e-6 * batch * context + 1.2e-6 * (rows - batch) * context

    near = {4: {n: cost(4, n, 100) for n in (4, 8, 12)}}
    far = {4: {n: cost(4, n, 700) for n in (4, 8, 12)}}
    table = plans.Priced(near, {1: 0.01}, 100, 700, far)
    slots, drafted = 100 + 300 + 400 + 1000, 6 * 1000 + 2 * 100  # 6 draft rows in the 1000-token slot, 2 in another
    assert table.t(4, 12, slots, drafted) == pytest.approx(0.040 + 0.012 + 5e-6 * slots + 1.2e-6 * drafted)
    assert table.t(4, 4, 4 * 700) == pytest.approx(cost(4, 4, 700))
    assert plans.Priced(near, {1: 0.01}).t(4, 12, slots, drafted) == pytest.approx(cost(4, 12, 100))
    again = plans.Priced.from_json(table.to_json())
    assert again.t(4, 12, slots, drafted) == pytest.approx(table.t(4, 12, slots, drafted))
