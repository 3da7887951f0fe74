"""``specfamily``: compare drafters on a dataset and write a report (a Hydra app).

With no arguments it runs the default comparison (configs/config.yaml): the zoo target, every registered drafter and
plain decoding on held-out prompts, greedy. Overrides select and change config groups (``drafter=eagle
drafter.gamma=6 sampling=t07 dataset=continue``), ``--multirun`` sweeps, ``torchrun ... -m specfamily.cli`` shards
the prompts, ``--config-dir DIR`` adds the user's config folders (:mod:`specfamily.eval.searchpath`). The config is
checked before any model loads (a config error exits 2 with one line naming the key); a run in which every drafter
arm failed exits 1 after writing its report (in a sweep the job prints the same line and the sweep goes on).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from specfamily.eval.searchpath import ENTRY

# Ranks other than 0 write into rank 0's folder; they keep no Hydra outputs of their own.
_FOLLOWER_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled")
CONFIG_ERROR_STATUS = 2
ARMS_FAILED_STATUS = 1
MULTIRUN_FILE = "multirun.yaml"  # Hydra's record of a sweep's own config, in the sweep folder


def sweep_overrides(job: list[str], sweep: list[str]) -> list[str]:
    """A sweep job's own overrides: those of ``job`` whose key the sweep's command line does not fix to one value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed = {o.get_key_element() for o in parser.parse_overrides(sweep) if not o.is_sweep_override()}
    parsed = parser.parse_overrides(job)
    return [line for line, o in zip(job, parsed, strict=True) if o.get_key_element() not in fixed]


def _job_label() -> str | None:
    """In a multirun job, its own overrides (``drafter.gamma=4``) as one string; None in a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    job = list(hc.overrides.task)
    record = Path(hc.sweep.dir) / MULTIRUN_FILE
    sweep = list(OmegaConf.load(record).hydra.overrides.task) if record.is_file() else []
    return " ".join(sweep_overrides(job, sweep)) or f"job {hc.job.num}"


def _checked(cfg: DictConfig) -> None:
    """Check the whole config before anything loads; a config error ends the command with one line."""
    from specfamily.eval.config import RUN_LABEL, ConfigError, check_config

    try:
        check_config(cfg)
    except ConfigError as err:
        print(f"specfamily: config error: {err}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_STATUS) from None
    if cfg.get(RUN_LABEL) is None:
        with open_dict(cfg):
            cfg[RUN_LABEL] = _job_label()


@hydra.main(config_path=None, config_name=ENTRY, version_base=None)
def app(cfg: DictConfig) -> None:
    """One comparison into Hydra's output folder; rank 0 prints the table."""
    from hydra.core.hydra_config import HydraConfig

    from specfamily.eval.runner import run_experiment
    from specfamily.io.sources import UnreachableError

    _checked(cfg)
    own_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        outcome = run_experiment(cfg, own_dir)
    except UnreachableError as err:  # a hub name while offline: what to do, in one line
        print(f"specfamily: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    if outcome.rank == 0:
        print(f"\n{outcome.table}\nreport: {outcome.out_dir / 'report.md'}")
    elif own_dir.resolve() != outcome.out_dir.resolve() and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()
    if outcome.every_drafter_failed:
        print(f"specfamily: every drafter arm failed ({', '.join(outcome.failed_drafters)}); the errors are in "
              f"{outcome.out_dir / 'results.jsonl'}", file=sys.stderr)
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode != RunMode.MULTIRUN:  # in a sweep the other jobs go on
            raise SystemExit(ARMS_FAILED_STATUS)


def main() -> None:
    """Console script entry point (``specfamily``): the search path composed, then the Hydra app."""
    from specfamily.eval.searchpath import register_entry, with_search_path

    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv.extend(_FOLLOWER_OVERRIDES)
    try:
        sys.argv[1:] = with_search_path(sys.argv[1:])
    except ValueError as err:
        print(f"specfamily: config error: {err}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_STATUS) from None
    register_entry()
    app()


if __name__ == "__main__":
    main()
