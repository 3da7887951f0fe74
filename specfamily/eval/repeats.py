"""Plain repeats at run time: plain decoding re-timed on a shard's first prompt at the scheduled positions of the
run (what the timings mean and how they are checked: :mod:`specfamily.eval.noise`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from specfamily.eval.datasets import Prompt
from specfamily.eval.noise import pending_repeats
from specfamily.eval.results import RepeatRecord, ResultWriter, repeats_path
from specfamily.eval.start import RunPlan

log = logging.getLogger(__name__)


@dataclass
class PlainRepeats:
    """Plain decoding re-timed on a shard's first prompt (the probe) after the scheduled prompt positions."""

    plan: RunPlan
    probe: Prompt | None
    schedule: dict[int, int]  # prompt position -> repeat number
    writer: ResultWriter

    @classmethod
    def schedule_for(cls, plan: RunPlan, prompts: list[Prompt]) -> PlainRepeats:
        """The repeats this rank still owes on its shard ``prompts`` (none recorded twice on a resumed run)."""
        schedule = pending_repeats(plan.out_dir, plan.info.rank, len(prompts), plan.noise.repeats)
        path = repeats_path(plan.out_dir, plan.info.rank, plan.info.world_size)
        return cls(plan, prompts[0] if prompts else None, schedule, ResultWriter(path))

    def after(self, position: int) -> None:
        """Run and record the repeat scheduled after prompt ``position``, if any."""
        repeat = self.schedule.get(position)
        if repeat is None or self.probe is None:
            return
        import specfamily as sf

        plan, probe = self.plan, self.probe
        try:
            start = time.perf_counter()
            result = sf.generate(plan.target, None, probe.ids, plan.dataset.max_new_tokens, plan.sampling,
                                 seed=plan.seed + probe.index)
            wall = time.perf_counter() - start
        except Exception as err:  # the noise measurement never stops the run
            log.warning("plain repeat %d failed: %s: %s", repeat, type(err).__name__, err)
            plan.target.reset()
            return
        self.writer.write(RepeatRecord(probe.id, probe.index, repeat, position + 1, list(result.tokens), wall,
                                       plan.info.rank))
