"""The runner's batched arm end to end on tiny saved models: one record per request with its timing, greedy text equal
to the batch-1 run's, chat turns after the arm's own answers, resumption, the batch-1 path's records unchanged."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from eval_helpers import chat_overrides, tiny_overrides

from specfamily.eval.batching import poisson_arrivals
from specfamily.eval.results import PromptRecord, RunInfo, read_records
from specfamily.eval.runner import run_experiment


def _prompts(folder) -> list[PromptRecord]:
    return [r for r in read_records(folder / "results.jsonl") if isinstance(r, PromptRecord)]


def _tokens(records) -> dict[tuple[str, str], list[int]]:
    return {r.key: r.tokens for r in records}


def _self_draft(pair, *extra: str) -> list[str]:
    """The tiny pair with the target as its own draft model, 2 draft tokens a pass: every draft token is accepted."""
    return tiny_overrides(pair, f"model.draft={pair['target']}", "drafter.gamma=2", *extra)


@pytest.fixture(scope="module")
def batch_1_run(tiny_pair, tmp_path_factory):
    """The default path (batch_size 1) on the tiny pair: the reference the batched runs are held to."""
    from hydra import compose, initialize_config_dir

    from specfamily.eval.config import configs_dir

    folder = tmp_path_factory.mktemp("batch_1")
    with initialize_config_dir(config_dir=str(configs_dir()), version_base=None):
        run_experiment(compose(config_name="config", overrides=_self_draft(tiny_pair)), folder)
    return folder


def test_a_batched_run_records_every_request_with_its_timing(tiny_pair, compose_config, tmp_path, batch_1_run):
    outcome = run_experiment(compose_config(_self_draft(tiny_pair, "batch_size=2")), tmp_path)
    records = _prompts(tmp_path)
    assert [(r.drafter, r.prompt_id) for r in records] == [(arm, f"p{i}") for i in range(3)
                                                           for arm in ("plain", "small_model")]
    assert _tokens(records) == _tokens(_prompts(batch_1_run))  # greedy: each request's batch-1 text
    assert all(len(r.tokens) == 10 for r in records) and [r.seed for r in records[::2]] == [0, 1, 2]
    for arm in ("plain", "small_model"):
        mine = [r for r in records if r.drafter == arm]
        (call,) = {(r.batch["call_wall_seconds"], r.batch["call_cpu_seconds"]) for r in mine}  # one call per arm
        assert call[0] > 0 and call[1] > 0
        for r in mine:
            b = r.batch
            assert (b["size"], b["requests"], b["arrival_rate"], b["arrival_s"]) == (2, 3, None, 0.0)
            assert r.wall_seconds == b["latency_s"] == b["finish_s"] and 0 < b["latency_s"] <= call[0]
            assert 0 < b["ttft_s"] == b["first_token_s"] < b["finish_s"]
            assert b["tokens_per_second"] == pytest.approx(10 / b["latency_s"])
    assert [r.metrics["acceptance_rate"] for r in records[1::2]] == [1.0] * 3  # the drafter drafted, all accepted
    assert all(r.metrics["mean_accepted_length"] > 2 for r in records[1::2])
    text = (tmp_path / "report.md").read_text()
    goodput = {row.drafter: row for row in outcome_rows(tmp_path)}
    plain = goodput["plain"]
    assert plain.goodput == pytest.approx(30 / records[0].batch["call_wall_seconds"]) and plain.batch_size == 2
    assert f"| plain | 2 | all at once | 3 | {plain.goodput:.1f} | 1.00 |" in text
    assert RunInfo.load(tmp_path).config["batch_size"] == 2 and outcome.records


def test_poisson_arrivals_reach_the_loop_and_every_arm_sees_the_same(tiny_pair, compose_config, tmp_path):
    run_experiment(compose_config(_self_draft(tiny_pair, "batch_size=2", "arrival_rate=40", "seed=5")), tmp_path)
    records = _prompts(tmp_path)
    arrivals = poisson_arrivals(3, 40.0, 5 + 1)  # seeded by seed + turn
    assert arrivals[0] == 0.0 and arrivals[2] > arrivals[1] > 0
    for arm in ("plain", "small_model"):
        mine = [r.batch for r in records if r.drafter == arm]
        assert [b["arrival_s"] for b in mine] == arrivals and all(b["arrival_rate"] == 40.0 for b in mine)
        for b in mine:
            assert b["arrival_s"] < b["first_token_s"] < b["finish_s"] and b["latency_s"] == pytest.approx(
                b["finish_s"] - b["arrival_s"]) and b["ttft_s"] == pytest.approx(b["first_token_s"] - b["arrival_s"])
    assert "| plain | 2 | 40 | 3 |" in (tmp_path / "report.md").read_text()


def outcome_rows(folder):
    from specfamily.eval.report import collect

    return collect(folder).goodput


def test_the_batch_1_path_writes_its_records_as_before(batch_1_run):
    lines = [json.loads(line) for line in (batch_1_run / "results.jsonl").read_text().splitlines()]
    fields = {f.name for f in dataclasses.fields(PromptRecord)} - {"batch"}
    assert lines and all(set(line) == fields for line in lines)  # no "batch" key: the lines of before
    assert "## Load" not in (batch_1_run / "report.md").read_text()
    config = RunInfo.load(batch_1_run).config
    assert (config["batch_size"], config["arrival_rate"], config["batched"]) == (1, None, False)


def test_batched_chat_turns_follow_each_arms_own_answers(chat_pair, compose_config, tmp_path):
    single, batched = tmp_path / "single", tmp_path / "batched"
    run_experiment(compose_config(chat_overrides(chat_pair, "drafter.gamma=2")), single)
    run_experiment(compose_config(chat_overrides(chat_pair, "drafter.gamma=2", "batch_size=2")), batched)
    records = _prompts(batched)
    assert sorted(r.key for r in records) == sorted(r.key for r in _prompts(single))
    assert _tokens(records) == _tokens(_prompts(single))  # turn 2 asked after the arm's own (same) answer
    turn_2 = [r for r in records if r.turn == 2]
    assert [r.prompt_id for r in turn_2] == ["7:turn2", "7:turn2"] and all(r.batch["requests"] == 1 for r in turn_2)
    assert all(r.batch["requests"] == 2 for r in records if r.turn == 1)


@pytest.mark.parametrize("warmup", [1, 0])
def test_plain_decoding_rehearses_its_calls_untimed_before_they_are_timed(chat_pair, compose_config, tmp_path,
                                                                         monkeypatch, warmup):
    """Plain decoding, the first arm, runs its calls once (every turn, after its own answers, all at once) before the
    timed ones, so that it does not meet every prompt's shapes first; a drafter's arm does not; ``warmup=0``: neither
    warms up."""
    from specfamily.eval import batched

    calls, generate = [], batched._generate_batch

    def recorded(plan, drafter, ids, max_new_tokens, arrivals, trace=False):
        calls.append((drafter is None, [len(i) for i in ids], max_new_tokens, arrivals))
        return generate(plan, drafter, ids, max_new_tokens, arrivals, trace)

    monkeypatch.setattr(batched, "_generate_batch", recorded)
    run_experiment(compose_config(chat_overrides(chat_pair, "drafter.gamma=2", "batch_size=2", f"warmup={warmup}")),
                   tmp_path)
    turn_1, turn_2 = ([r.prompt_tokens for r in _prompts(tmp_path) if r.turn == t and r.drafter == "plain"]
                      for t in (1, 2))
    timed = [(True, turn_1, 10, None), (True, turn_2, 10, None)]
    drafted = [(False, lengths, n, at) for _, lengths, n, at in timed]
    if warmup:
        warm = (turn_1, 2, None)  # the first batch_size prompts, warmup_tokens
        assert calls == [(True, *warm), *timed, *timed, (False, *warm), *drafted]
    else:
        assert calls == [*timed, *drafted]


def test_a_rehearsal_that_raises_is_plain_decodings_warm_up_failure(tiny_pair, compose_config, tmp_path, monkeypatch):
    from specfamily.eval import batched
    from specfamily.eval.results import FailureRecord

    def broken(plan, prompts):
        raise RuntimeError("rehearsal broke")

    monkeypatch.setattr(batched, "_rehearse", broken)
    run_experiment(compose_config(_self_draft(tiny_pair, "batch_size=2")), tmp_path)
    records = read_records(tmp_path / "results.jsonl")
    (failure,) = [r for r in records if isinstance(r, FailureRecord)]
    assert (failure.drafter, failure.stage, failure.error) == ("plain", "warmup", "RuntimeError: rehearsal broke")
    assert {r.drafter for r in records if isinstance(r, PromptRecord)} == {"small_model"}  # the other arm went on


def test_a_batched_run_resumes_and_refuses_another_batch_size(tiny_pair, compose_config, tmp_path):
    overrides = tiny_overrides(tiny_pair, "drafter.gamma=2", "dataset.num_examples=2")
    run_experiment(compose_config([*overrides, "batch_size=3"]), tmp_path)
    before = (tmp_path / "results.jsonl").read_text()
    run_experiment(compose_config([*overrides, "batch_size=3"]), tmp_path)  # finished: nothing runs again
    assert (tmp_path / "results.jsonl").read_text() == before
    with pytest.raises(ValueError, match="holds a run with a different batch_size config"):
        run_experiment(compose_config([*overrides, "batch_size=2"]), tmp_path)


def test_batch_size_on_the_zoo_target(compose_config, tmp_path):
    """The shipped zoo target and its prompts, batch_size=2 over 3 requests (admission while others decode)."""
    cfg = compose_config(["model=zoo", "dataset=complete", "dataset.num_examples=3", "dataset.max_new_tokens=6",
                          "dataset.max_prompt_tokens=24", "drafter.names=[prompt_lookup]", "model.matmul=exact",
                          "threads=1", "progress=false", "plots=false", "warmup=0", "verify_cost.sizes=[0,1]",
                          "verify_cost.repeats=1", "noise.cost_rounds=1", "noise.repeats=0", "batch_size=2"])
    threads = torch.get_num_threads()
    try:
        run_experiment(cfg, tmp_path)
    finally:
        torch.set_num_threads(threads)  # the run set one thread for this whole process
    records = _prompts(tmp_path)
    assert [(r.drafter, r.batch["size"], r.batch["requests"]) for r in records] == [
        (arm, 2, 3) for _ in range(3) for arm in ("plain", "prompt_lookup")]
    plain = [r for r in records if r.drafter == "plain"]
    assert [r.tokens for r in plain] == [r.tokens for r in records if r.drafter == "prompt_lookup"]
    assert max(r.batch["arrival_s"] for r in plain) == 0.0 and all(len(r.tokens) <= 6 for r in plain)
    # the third request waited for a slot: it finished after the first two started, its latency counts the wait
    assert max(r.batch["first_token_s"] for r in plain) > min(r.batch["finish_s"] for r in plain)
