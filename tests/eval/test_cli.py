"""The ``specfamily`` Hydra app as users run it (subprocesses): sweeps, torchrun, config errors, user configs, arms."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eval_helpers import tiny_overrides
from transformers import LlamaConfig, LlamaForCausalLM

from specfamily.cli import ARMS_FAILED_STATUS, CONFIG_ERROR_STATUS, sweep_overrides
from specfamily.eval.results import FailureRecord, PromptRecord, RunInfo, read_records
from specfamily.eval.runner import RunOutcome, run_experiment


def _run(args: list[str], cwd, status: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **(env or {})}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == status, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _tokens(folder) -> list[tuple[str, str, list[int]]]:
    return [(r.drafter, r.prompt_id, r.tokens) for r in read_records(folder / "results.jsonl")
            if isinstance(r, PromptRecord)]


def test_two_point_multirun_writes_each_job_and_a_combined_report(tiny_pair, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = tiny_overrides(tiny_pair, "dataset.num_examples=2")
    done = _run([sys.executable, "-m", "specfamily.cli", "--multirun", "drafter.gamma=1,3",
                 f"hydra.sweep.dir={sweep}", *overrides], cwd=tmp_path)
    for job, gamma in (("0", 1), ("1", 3)):
        records = read_records(sweep / job / "results.jsonl")
        assert [(r.drafter, r.gamma) for r in records] == [("plain", None), ("small_model", gamma)] * 2
    combined = (sweep / "report.md").read_text()  # each job named by its own overrides, not its number
    assert "| drafter.gamma=1 | small_model | 1 | ok | 2 |" in combined
    assert "| drafter.gamma=3 | small_model | 3 | ok | 2 |" in combined
    assert RunInfo.load(sweep / "1").config["run_label"] == "drafter.gamma=3"
    assert "sweep report:" in done.stdout


def test_torchrun_two_ranks_equal_one_process(tiny_pair, compose_config, tmp_path):
    # a constant gamma: the cost-aware default sizes drafts from timings, so its sampled tokens vary run to run;
    # one thread, as each rank has under torchrun, so both runs add up logits in the same order
    overrides = tiny_overrides(tiny_pair, "dataset.num_examples=4", "sampling=t1", "drafter.gamma=2", "threads=1")
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    try:
        run_experiment(compose_config(overrides), single)
    finally:
        torch.set_num_threads(threads)  # the run set one thread for this whole process
    sharded = tmp_path / "sharded"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          "-m", "specfamily.cli", f"hydra.run.dir={sharded}", *overrides], cwd=tmp_path)
    records = read_records(sharded / "results.jsonl")
    assert sorted({r.rank for r in records}) == [0, 1]  # both ranks worked
    assert [r.prompt_id for r in records if r.rank == 1] == ["p1", "p1", "p3", "p3"]
    assert _tokens(sharded) == _tokens(single)  # same tokens, same order
    assert not list(sharded.glob("results.rank*.jsonl"))  # merged
    assert (sharded / "report.md").is_file()


@pytest.mark.slow  # three zoo runs in subprocesses: about 30 s of CPU
def test_the_batch_sweep_experiment_on_the_zoo_target(tmp_path):
    """``experiment=batch_sweep`` from the command line (its batch sizes overridden to two): one job per batch size,
    each through the batched arm, and the sweep report's speedup-by-batch-size table and plot."""
    sweep = tmp_path / "sweep"
    done = _run([sys.executable, "-m", "specfamily.cli", "experiment=batch_sweep", "batch_size=1,2", "model=zoo",
                 "dataset=complete", "dataset.num_examples=2", "dataset.max_new_tokens=4",
                 "dataset.max_prompt_tokens=16", "drafter.names=[prompt_lookup]", "model.matmul=exact", "threads=1",
                 "progress=false", "warmup=0",
                 "verify_cost.sizes=[0,1]", "verify_cost.repeats=1", "noise.cost_rounds=1", "noise.repeats=0",
                 f"hydra.sweep.dir={sweep}"], cwd=tmp_path)
    for job, batch in (("0", 1), ("1", 2)):
        records = read_records(sweep / job / "results.jsonl")
        assert [(r.drafter, r.batch["size"], r.batch["requests"]) for r in records] == [
            ("plain", batch, 2), ("prompt_lookup", batch, 2)] * 2
        assert RunInfo.load(sweep / job).config["run_label"] == f"batch_size={batch}"
    report = (sweep / "report.md").read_text()
    assert "## Speedup by load" in report and "| drafter | B=1 | B=2 | crossover |" in report
    assert (sweep / "speedup_by_batch.png").is_file() and "sweep report:" in done.stdout


def test_a_sweep_jobs_own_overrides():
    sweep = ["drafter=small_model,prompt_lookup", "drafter.gamma=2,4", "model=zoo", "progress=false"]
    job = ["drafter=prompt_lookup", "drafter.gamma=4", "model=zoo", "progress=False"]  # as Hydra writes a job's
    assert sweep_overrides(job, sweep) == ["drafter=prompt_lookup", "drafter.gamma=4"]
    assert sweep_overrides(["drafter.gamma=2"], []) == ["drafter.gamma=2"]  # swept by an experiment's sweeper params


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["drafter=small_model", "drafter.confidence=abc"], "drafter.confidence must be a number, got 'abc'"),
        (["drafter=small_model", "drafter.policy=fastest"], "drafter.policy must be one of"),
        (["dataset=jsonl", "dataset.field=text"], "dataset 'jsonl': path 'json' reads the files named by data_files"),
        (["drafter=prompt_lookup", "batch_size=0"], "batch_size: must be an integer >= 1 (requests decoded at once), "
                                                     "got 0"),
    ],
)
def test_a_config_error_exits_before_any_model_loads_with_one_line(tmp_path, overrides, message):
    done = _run([sys.executable, "-m", "specfamily.cli", "model.target=/no/such/model", "model.draft=/no/such/draft",
                 f"hydra.run.dir={tmp_path / 'run'}", *overrides], cwd=tmp_path, status=CONFIG_ERROR_STATUS)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specfamily: config error: ") and message in lines[0]
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_an_offline_hub_model_is_one_line_and_a_missing_prompt_file_fails_before_any_model(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = _run([sys.executable, "-m", "specfamily.cli", "model.target=nobody-here/no-such-model-xyz",
                 "drafter=prompt_lookup", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, status=1, env=env)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specfamily: model 'nobody-here/no-such-model-xyz' is not a local")
    done = _run([sys.executable, "-m", "specfamily.cli", "model=zoo", "drafter=prompt_lookup", "dataset=jsonl",
                 f"dataset.data_files={tmp_path / 'missing.jsonl'}", f"hydra.run.dir={tmp_path / 'run2'}"],
                cwd=tmp_path, status=1, env=env)
    assert "missing.jsonl" in done.stderr and "Loading weights" not in done.stderr  # no model was loaded


ARMS_EXPERIMENT = """\
# @package _global_
defaults:
  - override /drafter: arms
drafter:
  arms:
    small_model:mine: {}
    small_model:g1:
      gamma: 1
"""


def test_labelled_arms_from_a_users_config_folder(tiny_pair, tmp_path):
    """A user folder's experiment (labelled arms) and drafter file (a shipped name): labels in results and table."""
    mine = tmp_path / "my_configs"
    (mine / "experiment").mkdir(parents=True)
    (mine / "drafter").mkdir()
    (mine / "experiment" / "two_gammas.yaml").write_text(ARMS_EXPERIMENT)
    (mine / "drafter" / "small_model.yaml").write_text("name: small_model\nmodel: ${model.draft}\ngamma: 3\n")
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_pair, "dataset.num_examples=2") if not o.startswith("drafter.names")]
    done = _run([sys.executable, "-m", "specfamily.cli", "--config-dir", str(mine), "experiment=two_gammas",
                 f"hydra.run.dir={out}", *overrides], cwd=tmp_path)
    records = read_records(out / "results.jsonl")
    arms = [("plain", None), ("small_model:mine", 3), ("small_model:g1", 1)]  # gamma 3: the user's drafter file
    assert [(r.drafter, r.gamma) for r in records] == arms * 2
    assert "| small_model:mine | 3 | ok | 2 |" in done.stdout and "| small_model:g1 | 1 | ok | 2 |" in done.stdout
    assert RunInfo.load(out).drafters == ["plain", "small_model:mine", "small_model:g1"]


def test_a_run_whose_every_drafter_arm_failed_exits_non_zero(tiny_pair, tmp_path):
    """The only drafter arm cannot be built (its draft model has another vocabulary): the run still writes its
    results and report (plain decoding ran), then exits with status 1 and one line naming the failed arm."""
    draft = tmp_path / "other_vocab"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(draft)
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_pair, "dataset.num_examples=1") if not o.startswith("model.draft=")]
    done = _run([sys.executable, "-m", "specfamily.cli", f"model.draft={draft}", f"hydra.run.dir={out}", *overrides],
                cwd=tmp_path, status=ARMS_FAILED_STATUS)
    assert done.stderr.strip().splitlines()[-1] == (
        f"specfamily: every drafter arm failed (small_model); the errors are in {out / 'results.jsonl'}")
    records = read_records(out / "results.jsonl")
    assert [(type(r).__name__, r.drafter) for r in records] == [
        ("FailureRecord", "small_model"), ("PromptRecord", "plain")]  # the arm failed while being built
    assert (out / "report.md").is_file()


def test_every_drafter_failed_needs_a_drafter_arm_and_a_failure_for_each():
    plain = PromptRecord(drafter="plain", dataset="d", sampling="greedy", prompt_id="p0", index=0, seed=0, gamma=None,
                         prompt_tokens=1, tokens=[1], wall_seconds=0.1, lossy=False, metrics={})
    failure = FailureRecord(drafter="a", stage="create", error="ValueError: no")
    assert RunOutcome(Path("."), 0, [plain, failure], drafters=["a"]).every_drafter_failed
    assert not RunOutcome(Path("."), 0, [plain, failure], drafters=["a", "b"]).every_drafter_failed
    assert not RunOutcome(Path("."), 0, [plain], drafters=[]).every_drafter_failed  # plain decoding only
    assert not RunOutcome(Path("."), 1, [], drafters=["a"]).every_drafter_failed  # a follower rank holds no records
