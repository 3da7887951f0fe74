"""Sweeps: a Hydra callback that writes one combined report over every job of a multirun.

``specfamily --multirun drafter=small_model,prompt_lookup drafter.gamma=2,4,6`` runs one full comparison per
combination into ``<sweep dir>/<job number>``; at the end this writes ``report.md``, ``summary.csv`` and the plots
into the sweep folder, each job named by its overrides (its ``run_label``). ``specfamily-report <sweep dir>`` does
the same by hand.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SweepReport(Callback):
    """Hydra callback (``hydra.callbacks.sweep_report``): the combined report at the end of a multirun."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from specfamily.eval.report import write_report
        from specfamily.train.distributed import env_world

        if env_world()[0] != 0:  # under torchrun only rank 0 writes the sweep report
            return
        folder = Path(config.hydra.sweep.dir)
        try:
            report = write_report(folder, plots=bool(config.get("plots", True)))
        except FileNotFoundError as err:  # every job failed before writing anything
            log.warning("no sweep report: %s", err)
            return
        print(f"\nsweep report: {folder / 'report.md'}\n{report.table}", end="")
