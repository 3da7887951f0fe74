"""The ``specfamily`` Hydra app as users run it: a multirun sweep and a 2-rank torchrun (subprocesses)."""

from __future__ import annotations

import os
import subprocess
import sys

from eval_helpers import tiny_overrides

from specfamily.eval.results import PromptRecord, read_records
from specfamily.eval.runner import run_experiment


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
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
    combined = (sweep / "report.md").read_text()
    assert "| 0 | small_model | 1 | ok | 2 |" in combined and "| 1 | small_model | 3 | ok | 2 |" in combined
    assert "sweep report:" in done.stdout


def test_torchrun_two_ranks_equal_one_process(tiny_pair, compose_config, tmp_path):
    overrides = tiny_overrides(tiny_pair, "dataset.num_examples=4", "sampling=t1")
    single = tmp_path / "single"
    run_experiment(compose_config(overrides), single)
    sharded = tmp_path / "sharded"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          "-m", "specfamily.cli", f"hydra.run.dir={sharded}", *overrides], cwd=tmp_path)
    records = read_records(sharded / "results.jsonl")
    assert sorted({r.rank for r in records}) == [0, 1]  # both ranks worked
    assert [r.prompt_id for r in records if r.rank == 1] == ["p1", "p1", "p3", "p3"]
    assert _tokens(sharded) == _tokens(single)  # same tokens, same order
    assert not list(sharded.glob("results.rank*.jsonl"))  # merged
    assert (sharded / "report.md").is_file()
