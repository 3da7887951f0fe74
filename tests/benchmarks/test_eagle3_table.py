"""benchmarks/eagle3_table.py: EAGLE-3 against EAGLE-1 per shape from a run folder's results, exact numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def table(benchmark_module):
    return benchmark_module("eagle3_table")


def prompt(drafter: str, index: int, passes: int, wall: float, alpha: float | None, depth: list) -> dict:
    """A results.jsonl prompt row with 10 new tokens."""
    return {"kind": "prompt", "drafter": drafter, "dataset": "spec_bench", "sampling": "greedy",
            "prompt_id": f"p{index}", "index": index, "seed": index, "gamma": None, "prompt_tokens": 5,
            "tokens": list(range(10)), "wall_seconds": wall, "lossy": False,
            "metrics": {"new_tokens": 10, "target_passes": passes, "acceptance_rate": alpha,
                        "per_position_acceptance": depth}}


ROWS = [
    prompt("plain", 0, 10, 2.0, None, []), prompt("plain", 1, 10, 2.0, None, []),
    prompt("eagle:c1", 0, 8, 1.0, 0.5, [0.5]),  # one prompt only: speedup on the prompts both finished
    prompt("eagle3:c1", 0, 7, 1.25, 0.6, [0.6]),
    prompt("eagle:c2", 0, 5, 1.0, 0.5, [0.6, 0.2]), prompt("eagle:c2", 1, 8, 1.5, 0.3, [0.4, None]),
    prompt("eagle3:c2", 0, 4, 0.8, 0.8, [0.8, 0.6]), prompt("eagle3:c2", 1, 5, 1.2, 0.5, [0.6, 0.4]),
    prompt("eagle:tree", 0, 4, 2.5, 0.6, [0.9, 0.5, 0.25]), prompt("eagle:tree", 1, 5, 2.5, 0.7, [1.0, 0.5]),
    {"kind": "failure", "drafter": "eagle3:tree", "stage": "create", "error": "ValueError: boom"},
]


@pytest.fixture
def run(tmp_path) -> Path:
    folder = tmp_path / "run1"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return folder


def test_pooled_tau_mean_alpha_depths_and_speedup_per_shape(table, run):
    sampling, rows = table.run_rows(run)
    assert sampling == "greedy" and [row.shape for row in rows] == ["c1", "c2", "c3", "c4", "tree"]
    c1, c2, c3, c4, tree = rows
    assert c1.eagle.tau == 10 / 8 and c1.eagle3.tau == 10 / 7 and c1.eagle.speedup == (10 / 1.0) / (10 / 2.0)
    assert c1.tau_ratio == pytest.approx(8 / 7) and c1.goal_met is False  # 1.143 < 1.15
    assert (c2.eagle.prompts, c2.eagle.new_tokens, c2.eagle.target_passes) == (2, 20, 13)
    assert c2.eagle.tau == 20 / 13 and c2.eagle3.tau == 20 / 9  # total new tokens / total passes
    assert c2.tau_ratio == pytest.approx(13 / 9) and c2.goal_met is True
    assert c2.eagle.alpha == pytest.approx(0.4) and c2.eagle3.alpha == pytest.approx(0.65)
    assert c2.eagle.depth == pytest.approx([0.5, 0.2])  # a prompt without a ratio at a depth is left out there
    assert c2.eagle3.depth == pytest.approx([0.7, 0.5])
    assert c2.eagle.speedup == pytest.approx((20 / 2.5) / (20 / 4.0)) and c2.eagle3.speedup == pytest.approx(2.0)
    assert c3.eagle is c3.eagle3 is None and c3.goal_met is None and c4.eagle is None
    assert tree.eagle.depth == pytest.approx([0.95, 0.5, 0.25]) and tree.eagle.speedup == pytest.approx(0.8)
    assert tree.eagle3.failure == "ValueError: boom" and tree.eagle3.prompts == 0 and tree.goal_met is None


def test_markdown_and_json_written_by_main(table, run, tmp_path, capsys):
    md, js = tmp_path / "t.md", tmp_path / "t.json"
    table.main([str(run), "--out-md", str(md), "--out-json", str(js)])
    expected = (
        "### run1: sampling greedy (2 prompts)\n\n"
        "| shape | tau EAGLE-1 | tau EAGLE-3 | tau ratio | >= 1.15x | alpha EAGLE-1 | alpha EAGLE-3 "
        "| acceptance by depth EAGLE-1 (mean over prompts) | acceptance by depth EAGLE-3 (mean over prompts) "
        "| speedup EAGLE-1 | speedup EAGLE-3 |\n"
        "| --- | ---: | ---: | ---: | :---: | ---: | ---: | --- | --- | ---: | ---: |\n"
        "| c1 | 1.25 | 1.43 | 1.14 | no | 0.50 | 0.60 | 0.50 | 0.60 | 2.00 | 1.60 |\n"
        "| c2 | 1.54 | 2.22 | 1.44 | yes | 0.40 | 0.65 | 0.50 / 0.20 | 0.70 / 0.50 | 1.60 | 2.00 |\n"
        "| c3 | - | - | - | - | - | - | - | - | - | - |\n"
        "| c4 | - | - | - | - | - | - | - | - | - | - |\n"
        "| tree | 2.22 | failed | - | - | 0.65 | failed | 0.95 / 0.50 / 0.25 | - | 0.80 | failed |\n\n"
        "EAGLE-3 tau >= 1.15x EAGLE-1's at every shape: no.\n"
        "- `eagle3:tree` failed: ValueError: boom\n"
    )
    assert capsys.readouterr().out == expected
    assert md.read_text() == expected
    data = json.loads(js.read_text())
    assert [(entry["sampling"], entry["goal"]) for entry in data] == [("greedy", 1.15)]
    c1, c3, tree = data[0]["rows"][0], data[0]["rows"][2], data[0]["rows"][4]
    assert c1["eagle"] == {"label": "eagle:c1", "prompts": 1, "new_tokens": 10, "target_passes": 8, "tau": 1.25,
                           "alpha": 0.5, "depth": [0.5], "speedup": 2.0, "failure": ""}
    assert c1["goal_met"] is False and c3 == {"shape": "c3", "eagle": None, "eagle3": None, "tau_ratio": None,
                                              "goal_met": None}
    assert tree["eagle3"]["tau"] is None and tree["eagle3"]["depth"] == []  # nan written as null


def test_every_shape_at_the_goal_says_yes(table):
    arm = table.ArmStats("x", 1, 10, 8, 1.0, 0.5, [0.5], 1.0)
    better = table.ArmStats("y", 1, 10, 8, 1.15, 0.5, [0.5], 1.0)
    rows = [table.shape_row(shape, arm, better) for shape in table.SHAPES]
    assert all(row.goal_met for row in rows)
    assert table.markdown("r", "t0.7", rows).endswith("EAGLE-3 tau >= 1.15x EAGLE-1's at every shape: yes.\n")


def test_a_folder_without_results_is_refused(table, tmp_path):
    with pytest.raises(SystemExit, match="has no prompt results: pass the folder of an eagle3_vs_eagle run"):
        table.run_rows(tmp_path)


@pytest.mark.parametrize("sampling", ["greedy", "t07"])
def test_the_experiment_composes_to_the_ten_fixed_shape_arms(sampling):
    from specfamily.eval.config import check_config, sampling_config, sampling_label
    from specfamily.eval.searchpath import compose

    cfg = compose(["model=smollm2", "experiment=eagle3_vs_eagle", f"sampling={sampling}"])
    specs = check_config(cfg)
    assert specs[0].label == "plain"
    chain = {"mode": "chain", "policy": "constant"}
    tree = {"mode": "tree", "policy": "constant", "gamma": 4, "total_tokens": 12}
    expected = [(f"{name}:c{g}", name, {**chain, "gamma": g}) for name in ("eagle", "eagle3") for g in (1, 2, 3, 4)]
    expected = expected[:4] + [("eagle:tree", "eagle", tree)] + expected[4:] + [("eagle3:tree", "eagle3", tree)]
    arms = [(spec.label, spec.name, spec.options) for spec in specs[1:]]
    assert [(label, name) for label, name, _ in arms] == [(label, name) for label, name, _ in expected]
    for (_, _, options), (label, _, shape) in zip(arms, expected, strict=True):
        assert {key: options[key] for key in shape} == shape, label
        assert options["weights"] is None, label  # model.eagle / model.eagle3 null: the zoo's for the target
    assert (cfg.dataset.path, cfg.dataset.max_new_tokens) == ("specfamily:spec_bench", 64)  # named after its path
    assert sampling_label(sampling_config(cfg.sampling)) == {"greedy": "greedy", "t07": "t0.7"}[sampling]
