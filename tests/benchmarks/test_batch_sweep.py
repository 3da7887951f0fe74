"""batch_sweep's plumbing on a tiny target: transformers' padded batch, the pass-cost ratio, the crossover (no timing
claims)."""

from __future__ import annotations

import sys

import pytest
import torch

import specfamily as sf
from specfamily.testing import tiny_target


@pytest.fixture
def sweep_module(benchmark_module):
    return benchmark_module("batch_sweep")


def test_transformers_padded_batch_gives_each_row_its_own_greedy_text(sweep_module):
    target = tiny_target("llama", vocab_size=32, spread=1.0)  # float64: padding cannot flip a near-tie
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    theirs = sweep_module.hf_batch(target.model, prompts, 6, target.eos_token_ids)
    ours = [r.tokens for r in sf.generate_batch(target, None, prompts, max_new_tokens=6)]
    assert theirs == ours


def test_pass_ratio_and_crossover(sweep_module):
    target = tiny_target("llama", vocab_size=32, spread=1.0, dtype=torch.float32)
    ratio = sweep_module.pass_ratio(target, [1, 2, 3, 4, 5, 6], 3, repeats=2, clock=__import__("time").perf_counter)
    assert ratio > 0
    result = sweep_module.Sweep(threads=1, clock="cpu", max_new_tokens=4)
    Row = sweep_module.Row
    result.rows += [Row("plain", 1, 1.0, 10), Row("plain", 2, 1.0, 20), Row("suffix", 1, 0.5, 10),
                    Row("suffix", 2, 2.0, 20)]
    assert result.speedup("suffix", 1) == 2.0 and result.speedup("suffix", 2) == 0.5
    assert result.crossover("suffix", [1, 2]) == 2
    table = sweep_module.table(result, [1, 2])
    assert "| suffix | 20.0 tok/s (2.00x) | 10.0 tok/s (0.50x) | 2 |" in table


def test_passes_table_gives_each_arm_its_passes_and_tau(sweep_module):
    result = sweep_module.Sweep(threads=1, clock="cpu", max_new_tokens=4)
    Row = sweep_module.Row
    result.rows += [Row("plain", 1, 1.0, 10, passes=11, round_taus=[0.91, 0.91]), Row("hf", 1, 1.0, 10),
                    Row("suffix", 1, 0.5, 10, passes=8, round_taus=[1.0, 1.52, 1.25])]
    table = sweep_module.passes_table(result, [1])
    assert table.splitlines()[2:] == ["| plain | 11 (0.91) |",  # hf counts no passes
                                      "| suffix | 8 (1.25; rounds 1.00-1.52) |"]  # a round that drafted nothing shows


def test_the_default_runs_workload_keeps_whole_prompts(sweep_module, monkeypatch):
    """--max-prompt-tokens 0 keeps each prompt whole; --per-category picks how many questions of each category."""
    seen = {}

    def fake_prompts(per_category, tokenizer):
        seen["per_category"] = per_category
        return [list(range(40)), list(range(50))], ["a", "b"]

    monkeypatch.setattr(sys.modules["common"], "spec_bench_prompts", fake_prompts)  # the workload's, in common.py
    monkeypatch.setattr(sweep_module.sf, "load_target", lambda *a, **k: tiny_target("llama", vocab_size=64))
    args = ["--batch-sizes", "1", "--drafters", "prompt_lookup", "--no-hf", "--max-new-tokens", "2", "--clock", "wall"]
    whole = sweep_module.sweep(sweep_module.parse_args([*args, "--per-category", "1", "--max-prompt-tokens", "0"]))
    assert seen["per_category"] == 1 and whole.prompt_tokens == [40, 50]
    cut = sweep_module.sweep(sweep_module.parse_args([*args, "--max-prompt-tokens", "32"]))
    assert seen["per_category"] == 3 and cut.prompt_tokens == [32, 32]
    assert {r.method for r in cut.rows} == {"plain", "prompt_lookup"} and all(r.passes > 0 for r in cut.rows)


def test_categories_keep_the_chosen_spec_bench_categories_and_refuse_an_unknown_one(sweep_module, monkeypatch):
    """--categories summarization,rag: the input-grounded tasks' prompts only, in their order, recorded."""
    monkeypatch.setattr(sys.modules["common"], "spec_bench_prompts", lambda per_category, tokenizer: (
        [list(range(40)), list(range(50)), list(range(60))], ["summarization", "qa", "rag"]))
    monkeypatch.setattr(sweep_module.sf, "load_target", lambda *a, **k: tiny_target("llama", vocab_size=64))
    args = ["--batch-sizes", "1", "--drafters", "prompt_lookup", "--no-hf", "--max-new-tokens", "2", "--clock", "wall",
            "--max-prompt-tokens", "0"]
    kept = sweep_module.sweep(sweep_module.parse_args([*args, "--categories", "summarization,rag"]))
    assert kept.prompt_tokens == [40, 60] and kept.categories == "summarization,rag"
    with pytest.raises(ValueError, match=r"unknown Spec-Bench categories \['code'\]; there are \['qa', 'rag', "):
        sweep_module.sweep(sweep_module.parse_args([*args, "--categories", "rag,code"]))


def test_gamma_gives_every_drafter_a_constant_length_the_length_policy_leaves_alone(sweep_module):
    from specfamily.core.policy import AutoPolicy

    target = tiny_target("llama", vocab_size=64)
    assert isinstance(sweep_module.make_drafter("prompt_lookup", target, None).policy, AutoPolicy)
    fixed = sweep_module.make_drafter("prompt_lookup", target, 2)
    assert not isinstance(fixed.policy, AutoPolicy) and fixed.policy.next_gamma() == 2


def test_every_batch_size_is_warmed_up_and_each_round_starts_one_method_later(sweep_module, monkeypatch):
    """The warm-up rounds run at every B (not only the first), and the timed rounds rotate which method runs first,
    so that no method always takes the first run's place; plain's tokens are still what every arm is compared with."""
    monkeypatch.setattr(sweep_module.sf, "load_target", lambda *a, **k: tiny_target("llama", vocab_size=64))
    monkeypatch.setattr(sys.modules["common"], "spec_bench_prompts",
                        lambda per_category, tokenizer: ([list(range(3, 13)), list(range(20, 30))], ["a", "b"]))
    order, real = [], sweep_module.sf.generate_batch

    def generate_batch(target, drafter, prompts, *args, **kwargs):
        order.append((len(prompts), "plain" if drafter is None else type(drafter).__module__.split(".")[2]))
        return real(target, drafter, prompts, *args, **kwargs)

    monkeypatch.setattr(sweep_module.sf, "generate_batch", generate_batch)
    args = ["--batch-sizes", "1,2", "--drafters", "prompt_lookup,suffix", "--no-hf", "--max-new-tokens", "2",
            "--clock", "wall", "--repeats", "3", "--max-prompt-tokens", "8"]
    result = sweep_module.sweep(sweep_module.parse_args([*args, "--plain-runs", "1"]))
    methods = [name for _, name in order]
    rounds = [methods[i : i + 3] for i in range(0, len(methods), 3)]
    warm = ["plain", "prompt_lookup", "suffix"]  # a warm-up round, then three timed ones, each starting later
    timed = [warm, ["prompt_lookup", "suffix", "plain"], ["suffix", "plain", "prompt_lookup"]]
    assert rounds == [warm, *timed] * 2
    assert [size for size, _ in order] == [1] * 12 + [2] * 12  # B=1 (one request), then B=2 (two)
    assert all(r.mismatched == 0 for r in result.rows)
    assert all(len(r.rounds) == 3 for r in result.rows)  # each timed round's own ratio to plain, paired
    assert all(r.rounds == [1.0] * 3 for r in result.rows if r.method == "plain")
    order.clear()
    result = sweep_module.sweep(sweep_module.parse_args([*args, "--batch-sizes", "2", "--repeats", "1"]))
    assert [name for _, name in order] == ["plain", "plain", "prompt_lookup", "plain", "suffix"] * 2  # --plain-runs 3
    assert [len(r.rounds) for r in result.rows] == [1, 1, 1] and all(r.mismatched == 0 for r in result.rows)
    assert result.plain_runs == 3


def test_hf_rounds_times_hf_in_the_first_rounds_only_paired_with_plains_same_rounds(sweep_module, monkeypatch):
    """hf runs in the warm-up and the first --hf-rounds timed rounds: its cell has that many paired ratios, each
    against the plain reference of its own round; 0 is refused, naming --no-hf."""
    monkeypatch.setattr(sweep_module.sf, "load_target", lambda *a, **k: tiny_target("llama", vocab_size=64))
    monkeypatch.setattr(sys.modules["common"], "spec_bench_prompts",
                        lambda per_category, tokenizer: ([list(range(3, 13)), list(range(20, 30))], ["a", "b"]))
    calls, real = [], sweep_module.hf_batch
    monkeypatch.setattr(sweep_module, "hf_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = ["--batch-sizes", "1", "--drafters", "prompt_lookup", "--max-new-tokens", "2", "--clock", "wall",
            "--repeats", "3", "--max-prompt-tokens", "8", "--plain-runs", "1"]
    result = sweep_module.sweep(sweep_module.parse_args([*args, "--hf-rounds", "1"]))
    hf = next(r for r in result.rows if r.method == "hf")
    assert len(calls) == 2  # the warm-up round and the first timed round (of three)
    assert len(hf.rounds) == 1 and all(len(r.rounds) == 3 for r in result.rows if r.method != "hf")
    assert result.hf_rounds == 1
    with pytest.raises(ValueError, match=r"--hf-rounds must be at least 1, got 0 \(--no-hf leaves hf out\)"):
        sweep_module.sweep(sweep_module.parse_args([*args, "--hf-rounds", "0"]))


def test_each_cell_gives_the_t_interval_of_its_paired_round_ratios(sweep_module):
    """A cell's interval is the mean of its rounds' ratios to plain (each round's methods back to back) plus or minus
    t(0.975, n - 1) times their standard error: two rounds at 0.96 and 1.00 give 0.98 +- 12.706 * 0.02."""
    result = sweep_module.Sweep(threads=1, clock="cpu", max_new_tokens=4)
    Row = sweep_module.Row
    result.rows += [Row("plain", 4, 1.0, 10, rounds=[1.0, 1.0]), Row("suffix", 4, 1.0, 10, rounds=[0.96, 1.0])]
    low, high = result.interval("suffix", 4)
    half = 12.7062 * 0.02
    assert low == pytest.approx(0.98 - half, abs=1e-4) and high == pytest.approx(0.98 + half, abs=1e-4)
    assert result.interval("plain", 4) is None and sys.modules["common"].paired_interval([0.97]) is None
    assert "| suffix | 10.0 tok/s (1.00x, 0.73-1.23) |" in sweep_module.table(result, [4])


def test_plain_runs_spread_through_the_round_from_where_it_stands(sweep_module):
    order = sweep_module.round_order
    methods = ["a", "b", "plain", "c", "d", "e"]
    assert order(methods, 1) == methods
    assert order(methods, 3) == ["plain", "a", "b", "plain", "c", "plain", "d", "e"]  # before methods 0, 2, 4
    assert order(["plain", "a"], 5) == ["plain", "plain", "a"]  # at most as many runs as methods
    with pytest.raises(ValueError, match="--plain-runs must be at least 1, got 0"):
        order(methods, 0)


def test_the_floor_verdict_tells_a_measured_loss_from_one_the_rounds_cannot_tell(sweep_module):
    """Every ratio is plain's seconds over the cell's (each 10 tokens): suffix 0.95x with rounds far under 0.98 is a
    measured loss, eagle 0.96x with rounds spread over 0.98 is unsure, medusa 1.00x met; hf is no drafter."""
    result = sweep_module.Sweep(threads=1, clock="cpu", max_new_tokens=4)
    Row = sweep_module.Row
    result.rows += [Row("plain", 4, 1.0, 10, rounds=[1.0] * 3), Row("hf", 4, 4.0, 10, rounds=[0.25] * 3),
                    Row("suffix", 4, 1 / 0.95, 10, rounds=[0.95, 0.951, 0.949]),
                    Row("eagle", 4, 1 / 0.96, 10, rounds=[0.90, 0.96, 1.02]), Row("medusa", 4, 1.0, 10,
                                                                                  rounds=[0.99, 1.0, 1.01])]
    verdict = sweep_module.floor_verdict(result, [4])
    assert verdict.startswith(">= 0.98x at every B: not shown; measurably under (interval below 0.98): "
                              "suffix B=4 0.950 (0.948-0.952); median under, interval reaching 0.98: eagle B=4 0.960 ")
    assert "medusa" not in verdict and "hf" not in verdict
    result.rows = [r for r in result.rows if r.method in ("plain", "medusa")]
    assert sweep_module.floor_verdict(result, [4]).startswith(">= 0.98x at every B: met; measurably under")


def test_a_sampled_sweep_samples_every_method_and_leaves_the_texts_uncompared(sweep_module, monkeypatch):
    """--temperature: generate_batch gets the sweep's sampling for plain and every drafter, transformers' generate
    samples too (every warp given, off ones too, else transformers fills in top-k 50), and a drafter's text, one draw of
    the target's law, is not held against plain decoding's; a bad temperature is refused before the target loads."""
    loads = []
    monkeypatch.setattr(sweep_module.sf, "load_target",
                        lambda *a, **k: loads.append(1) or tiny_target("llama", vocab_size=64))
    monkeypatch.setattr(sys.modules["common"], "spec_bench_prompts",
                        lambda per_category, tokenizer: ([list(range(3, 13)), list(range(20, 30))], ["a", "b"]))
    seen, real = [], sweep_module.sf.generate_batch

    def generate_batch(target, drafter, prompts, max_new_tokens, sampling, **kwargs):
        seen.append(sampling)
        return real(target, drafter, prompts, max_new_tokens, sampling, **kwargs)

    monkeypatch.setattr(sweep_module.sf, "generate_batch", generate_batch)
    hf, real_hf = [], sweep_module.hf_batch
    monkeypatch.setattr(sweep_module, "hf_batch", lambda *a: hf.append(a[-1]) or real_hf(*a))
    args = ["--batch-sizes", "2", "--drafters", "prompt_lookup,suffix", "--max-new-tokens", "6", "--clock", "wall",
            "--max-prompt-tokens", "8", "--plain-runs", "1"]
    result = sweep_module.sweep(sweep_module.parse_args([*args, "--temperature", "1.5", "--top-p", "0.9"]))
    sampled = sweep_module.SamplingConfig(temperature=1.5, top_p=0.9)
    assert seen == [sampled] * 6 and hf == [sampled] * 2  # warm-up and timed round: plain and two drafters, and hf
    assert result.sampling == {"temperature": 1.5, "top_k": 0, "top_p": 0.9}
    assert all(r.mismatched == 0 and r.tokens == 12 for r in result.rows)  # 2 requests of 6 tokens (no EOS here)
    assert sweep_module.hf_sampling(sampled) == {"do_sample": True, "temperature": 1.5, "top_k": 0, "top_p": 0.9}
    assert sweep_module.hf_sampling(None) == {"do_sample": False}
    with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0, got -1.0"):
        sweep_module.sweep(sweep_module.parse_args([*args, "--temperature", "-1"]))
    assert len(loads) == 1


def test_transformers_sampled_batch_draws_from_the_seeded_global_generator(sweep_module):
    """hf_batch sampling: rows of at most 8 new tokens (up to an EOS drawn), the same rows again under the same torch
    seed, other rows under another."""
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    prompts, sampled = [[1, 2, 3, 4, 5], [6, 7]], sweep_module.SamplingConfig(temperature=1.0)
    draws = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        draws.append(sweep_module.hf_batch(target.model, prompts, 8, target.eos_token_ids, sampled))
    assert draws[0] == draws[1] != draws[2]
    assert all(0 < len(row) <= 8 for row in draws[0])
