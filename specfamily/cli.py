"""``specfamily``: compare drafters on a dataset and write a report (a Hydra app).

With no arguments it runs the default comparison (configs/config.yaml): the zoo target, every
registered drafter and plain decoding on held-out prompts, greedy. Overrides select and change
config groups (``drafter=eagle drafter.gamma=6 sampling=t07 dataset=continue``), ``--multirun``
sweeps, and ``torchrun --nproc_per_node N -m specfamily.cli ...`` shards the prompts over ranks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

# Ranks other than 0 write into rank 0's folder; they keep no Hydra outputs of their own.
_FOLLOWER_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled")


@hydra.main(config_path="configs", config_name="config", version_base=None)
def app(cfg: DictConfig) -> None:
    """One comparison into Hydra's output folder; rank 0 prints the table."""
    from hydra.core.hydra_config import HydraConfig

    from specfamily.eval.runner import run_experiment

    own_dir = Path(HydraConfig.get().runtime.output_dir)
    outcome = run_experiment(cfg, own_dir)
    if outcome.rank == 0:
        print(f"\n{outcome.table}\nreport: {outcome.out_dir / 'report.md'}")
    elif own_dir.resolve() != outcome.out_dir.resolve() and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()


def main() -> None:
    """Console script entry point (``specfamily``)."""
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv.extend(_FOLLOWER_OVERRIDES)
    app()


if __name__ == "__main__":
    main()
