"""benchmarks/pass_goals.py: one tiny run on the shipped code target (the arms, the caches it grows, the goals'
lines and each miss's parts), the drafts' shapes, the verdicts, and the run folders' parsing."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
TINY = ["--model", "zoo:code-target", "--matmul", "skinny", "--threads", "1", "--per-category", "0", "--code", "2",
        "--new-tokens", "12", "--every", "6", "--repeats", "1", "--decode-tokens", "6", "--decode-rounds", "1",
        "--gb", "0.001", "--profile-passes", "2"]


@pytest.fixture
def goals(benchmark_module):
    return benchmark_module("pass_goals")


def test_a_tiny_run_times_every_arm_over_growing_caches_and_splits_each_miss(goals, capsys, tmp_path):
    result = goals.main([*TINY, "--json", str(tmp_path / "goals.json")])
    (name, measured), = result["sets"].items()
    assert name == "complete" and measured["prompts"] == 2
    lengths = measured["lengths"]
    assert len(lengths) == 4 and lengths[1] - lengths[0] == 6 and lengths[3] - lengths[2] == 6  # 2 caches a prompt
    arms = {f"{kind} {s}" for kind in goals.KINDS for s in ("greedy", "sampled")}
    assert set(measured["arms"]) == arms
    assert all(len(seconds) == 4 and min(seconds) >= 0 for by_step in measured["arms"].values()
               for seconds in by_step.values())
    assert measured["kv_bytes"][1] > measured["kv_bytes"][0]
    names = [g["name"] for g in result["goals"]]
    assert names == ["complete: plain pass / floor", "complete: chain pass / plain pass (greedy)",
                     "complete: tree pass / plain pass (greedy)",
                     "complete: plain decoding sampled / greedy (ms/token)", "complete: plain pass sampled / greedy",
                     "complete: chain pass sampled / greedy", "complete: tree pass sampled / greedy"]
    missed = {arm for g in result["goals"] if not g["met"] for arm in g["arms"]}
    assert missed, "a 2-layer model's pass is far from its floor: goal 1 misses"
    assert set(result["parts"]["complete"]) == missed
    for part in result["parts"]["complete"].values():
        assert part["products"] > 0 and part["attention"] > 0
        assert math.isclose(part["products"] + part["attention"] + part["verification"] + part["rest"], part["pass"])
    printed = capsys.readouterr().out
    assert "sampled = SamplingConfig(temperature=0.7, top_k=0, top_p=0.9) (sampling=chat)" in printed
    assert "| complete: plain pass / floor (floor " in printed and "| set | arm | pass ms | products ms |" in printed
    assert result["bandwidth"] == max(result["probes"].values()) and "sum" in result["probes"]
    assert "(the faster probe over 0.001 GB: sum " in printed
    assert goals.parse_args([]).gb is None  # by default the probes read a working set the size of the weights
    floor = result["goals"][0]["note"]
    assert " a pass: weights " in floor and " + KV cache " in floor and "over the weights alone" in floor
    assert "1 thread(s)" in printed and "cpu clock" in printed  # one thread: CPU time (more threads: the wall)
    assert (tmp_path / "goals.json").is_file()


def test_chat_is_the_shipped_sampling_preset(goals):
    preset = yaml.safe_load((ROOT / "configs" / "sampling" / "chat.yaml").read_text())
    assert (goals.CHAT.temperature, goals.CHAT.top_k, goals.CHAT.top_p) == (
        preset["temperature"], preset["top_k"], preset["top_p"])


@torch.inference_mode()
def test_greedy_verification_takes_the_trees_second_branch(goals):
    """The drafts come from the greedy continuation: the chain is accepted whole, the tree along its second branch
    (the path the arms commit: a rewrite), so the timed passes have the shapes the goals name."""
    import specfamily as sf
    from specfamily.core.acceptance import verify_draft
    from specfamily.core.target import load_target

    target = load_target("zoo:code-target", device="cpu", matmul="skinny")
    shapes = goals.Shapes(4)
    prompt = list(range(10, 30))
    sequence = prompt + sf.generate(target, None, prompt, max_new_tokens=8).tokens
    target.reset()
    target.forward(torch.tensor(prompt[:-1]))
    target.commit([])
    root, by_kind = goals.drafts(sequence, target.cached_length, shapes, target.vocab_size)
    for kind, accepted in (("chain", [0, 1, 2, 3]), ("tree", shapes.tree_path)):
        logits = target.forward(root, by_kind[kind]).logits
        target.commit([])
        target.rollback(len(prompt) - 1)
        assert verify_draft(by_kind[kind], logits, goals.GREEDY, None)[0] == accepted


def test_verdicts(goals):
    Goal = sys.modules["pass_goals_runs"].Goal
    assert Goal("a", 1.2, 1.2).met and not Goal("a", 1.21, 1.2).met
    assert Goal("b", 0.98, 0.98, at_least=True).met and not Goal("b", 0.97, 0.98, at_least=True).met
    assert not Goal("c", math.nan, 1.0).met and not Goal("c", math.nan, 1.0, at_least=True).met
    assert Goal("d", 1.3, 1.2, ("plain greedy",)).as_dict()["met"] is False
    unmeasured = Goal("e", 0.6, 1.2, measured=False, note="no floor")
    assert not unmeasured.met and "| e (no floor) | 0.600 | <= 1.20 | not measured |" in sys.modules[
        "pass_goals_runs"].goals_table([unmeasured])


def test_a_probe_slower_than_the_pass_gives_no_floor(goals):
    """On a loaded thread the bandwidth probe can read slower than the pass reads the weights: goal 1 then says it
    measured nothing, and its arm is not split as a miss."""
    arms = goals.Arms()
    arms.add(100, {arm: {"forward": 0.02, "verify": 0.0, "commit": 0.0} for arm in
                   ("plain greedy", "plain sampled", "chain greedy", "chain sampled", "tree greedy", "tree sampled")})
    decode = {"greedy": 20.0, "sampled": 20.0}
    slow_probe, fast_probe = {"weights": 0.03, "kv": 0.001}, {"weights": 0.015, "kv": 0.001}
    assert not goals.set_goals("s", arms, slow_probe, decode)[0].measured
    floor = goals.set_goals("s", arms, fast_probe, decode)[0]
    assert floor.measured and math.isclose(floor.value, 0.02 / 0.016) and not floor.met


def _run(folder: Path, sampling: str, rows: list[tuple]) -> Path:
    folder.mkdir()
    with (folder / "summary.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "dataset", "sampling", "drafter", "status", "tau", "speedup", "predicted_speedup"])
        for drafter, status, speedup, predicted in rows:
            writer.writerow([".", "spec_bench", sampling, drafter, status, 1.5, speedup, predicted])
    return folder


def test_run_folders_give_the_run_goals(goals, tmp_path):
    runs = sys.modules["pass_goals_runs"]
    greedy = _run(tmp_path / "greedy", "greedy", [("plain", "ok", 1.0, 1.0), ("suffix", "ok", 1.38, 1.34),
                                                   ("eagle3", "ok", 0.97, 1.12), ("medusa", "failed", "", "")])
    sampled = _run(tmp_path / "sampled", "t0.7-p0.9", [("plain", "ok", 1.0, 1.0), ("suffix", "ok", 1.21, 1.18),
                                                      ("eagle", "ok", 1.05, 1.01)])
    found, table = runs.run_goals(greedy, sampled)
    by_name = {g.name: g for g in found}
    error = by_name["greedy run spec_bench (greedy): every drafter's abs(predicted / measured - 1)"]
    assert math.isclose(error.value, 1.12 / 0.97 - 1) and not error.met and "worst eagle3" in error.note
    slowest = by_name["greedy run spec_bench (greedy): every drafter's speedup"]
    assert slowest.value == 0.97 and not slowest.met and slowest.note == "slowest eagle3"
    best = by_name["sampled run spec_bench (t0.7-p0.9): the best drafter's speedup"]
    assert best.value == 1.21 and not best.met and best.note == "suffix"
    assert by_name["sampled run spec_bench (t0.7-p0.9): every drafter's speedup"].met
    assert len(found) == 5 and "medusa" not in table and "| greedy run | spec_bench | greedy | suffix |" in table


def test_a_sampled_run_at_another_setting_says_so(goals, tmp_path):
    runs = sys.modules["pass_goals_runs"]
    sampled = _run(tmp_path / "t07", "t0.7", [("suffix", "ok", 1.3, 1.3)])
    (*_, best), _ = runs.run_goals(None, sampled)
    assert best.met and best.note == "suffix; run at t0.7, not t0.7/p0.9"


def test_a_folder_without_a_summary_or_its_columns_is_refused(goals, tmp_path):
    runs = sys.modules["pass_goals_runs"]
    with pytest.raises(SystemExit, match="no summary.csv"):
        runs.run_goals(tmp_path, None)
    (tmp_path / "summary.csv").write_text("run,dataset,drafter\n.,spec_bench,suffix\n")
    with pytest.raises(SystemExit, match=r"no column\(s\) \['sampling', 'status', 'speedup', 'predicted_speedup'\]"):
        runs.run_goals(tmp_path, None)
