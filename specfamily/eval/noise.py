"""The run's own noise measurement: is this machine steady enough for its speedups to mean anything?

Every run measures its noise two ways and flags the results when either spread exceeds ``noise.threshold``:

- **plain repeats**: plain decoding re-timed on the rank's first prompt ``noise.repeats`` times at evenly spaced
  points of the run; spread = (max - min) / median of the seconds per new token.
- **verify cost**: the pass-time curve measured ``noise.cost_rounds`` times; spread = the median over sizes of
  (max - min) / median across rounds. The curve itself is the median of the rounds.

A steady neighbour that slows every timing alike shows in neither; ``run.json``'s load average tells.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specfamily.eval.config import PLAIN
from specfamily.eval.results import NoiseCheck, PromptRecord, Record, RepeatRecord, RunInfo, read_repeats, read_run

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 0.10
PLAIN_REPEATS = "plain_repeats"
VERIFY_COST = "verify_cost"


@dataclass(frozen=True)
class NoiseSettings:
    """The ``noise`` config node: ``repeats``, ``cost_rounds``, ``threshold`` (all optional)."""

    repeats: int = 3  # plain-decoding re-timings of the rank's first prompt, evenly spaced over the run
    cost_rounds: int = 3  # verify-cost measurements whose spread is checked (1: no check)
    threshold: float = DEFAULT_THRESHOLD  # relative spread above which the timings are flagged unstable

    def __post_init__(self) -> None:
        for key in ("repeats", "cost_rounds"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "cost_rounds" else 0):
                raise ValueError(f"noise.{key} must be an integer >= {1 if key == 'cost_rounds' else 0}, got {value!r}")
        if not isinstance(self.threshold, int | float) or not self.threshold > 0:
            raise ValueError(f"noise.threshold must be a number > 0, got {self.threshold!r}")

    @classmethod
    def from_config(cls, node: Any) -> NoiseSettings:
        """From the config's ``noise`` node (None: the defaults); an unknown key is a TypeError."""
        options = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
        unknown = sorted(set(options) - {"repeats", "cost_rounds", "threshold"})
        if unknown:
            raise TypeError(f"noise config got unknown key(s) {unknown}; valid keys: repeats, cost_rounds, threshold")
        return cls(**options)


def repeat_schedule(n_prompts: int, repeats: int) -> dict[int, int]:
    """Prompt position (0-based) -> the repeat to run after it: ``repeats`` evenly spaced, the last at the end."""
    if n_prompts < 1 or repeats < 1:
        return {}
    schedule: dict[int, int] = {}
    for k in range(1, repeats + 1):
        schedule.setdefault(max(0, math.ceil(k * n_prompts / repeats) - 1), len(schedule) + 1)
    return schedule


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median of ``values``; nan with fewer than two values or a median <= 0."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return math.nan
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else math.nan


def _check(name: str, spread: float, threshold: float, samples: int, detail: str) -> NoiseCheck:
    measured = math.isfinite(spread)
    return NoiseCheck(name=name, spread=spread if measured else None, threshold=threshold, samples=samples,
                      unstable=measured and spread > threshold, detail=detail)


def plain_repeat_check(records: Sequence[Record], repeats: Sequence[RepeatRecord], threshold: float) -> NoiseCheck:
    """Spread of plain decoding's seconds per token on the same prompt over the run (the worst rank's)."""
    if not repeats:
        return _check(PLAIN_REPEATS, math.nan, threshold, 0, "not measured (noise.repeats = 0 or an older run)")
    plain = {r.prompt_id: r for r in records if isinstance(r, PromptRecord) and r.drafter == PLAIN}
    worst, samples, same, described = math.nan, 0, 0, ""
    for rank in sorted({r.rank for r in repeats}):
        mine = [r for r in repeats if r.rank == rank]
        first = plain.get(mine[0].prompt_id)  # seconds per new token of its own plain record and of its repeats
        timed = [first.wall_seconds / len(first.tokens)] if first is not None and first.tokens else []
        timed += [r.wall_seconds / len(r.tokens) for r in mine if r.tokens]
        matched = sum(first is not None and r.tokens == first.tokens for r in mine)  # repeats with its tokens
        spread = relative_spread(timed)
        samples, same = samples + len(timed), same + matched
        if not math.isfinite(worst) or spread > worst:
            worst, described = spread, f"prompt `{mine[0].prompt_id}`" + (f" on rank {rank}" if rank else "")
    detail = (f"plain decoding of {described} timed {samples} times over the run (its own record and "
              f"{len(repeats)} repeat(s); {same} of {len(repeats)} repeat(s) gave the same tokens)")
    return _check(PLAIN_REPEATS, worst, threshold, samples, detail)


def verify_cost_check(pass_seconds: Sequence[dict[str, float]], threshold: float) -> NoiseCheck:
    """Median over pass sizes of the relative range of a size's median pass time across the rounds."""
    if len(pass_seconds) < 2:
        return _check(VERIFY_COST, math.nan, threshold, len(pass_seconds),
                      "not checked (fewer than 2 verify-cost rounds: noise.cost_rounds)")
    sizes = sorted(set.intersection(*(set(r) for r in pass_seconds)), key=int)
    spreads = [relative_spread([r[g] for r in pass_seconds]) for g in sizes]
    spreads = [s for s in spreads if math.isfinite(s)]
    spread = statistics.median(spreads) if spreads else math.nan
    detail = (f"the target's pass times measured in {len(pass_seconds)} rounds over {len(sizes)} pass sizes "
              "(median over sizes of each size's spread across rounds)")
    return _check(VERIFY_COST, spread, threshold, len(pass_seconds), detail)


def noise_checks(records: Sequence[Record], repeats: Sequence[RepeatRecord], info: RunInfo) -> list[NoiseCheck]:
    """Both checks of one run, against the run's own threshold."""
    threshold = float((info.config.get("noise") or {}).get("threshold", DEFAULT_THRESHOLD))
    return [plain_repeat_check(records, repeats, threshold), verify_cost_check(info.pass_seconds, threshold)]


def describe(check: NoiseCheck, verdict: bool = True) -> str:
    """One line: the verdict (unless ``verdict`` is False), the spread against the threshold, what was timed."""
    label = {PLAIN_REPEATS: "plain repeats", VERIFY_COST: "verify-cost rounds"}.get(check.name, check.name)
    if check.spread is None:
        return f"{label}: {check.detail}"
    relation = ">" if check.unstable else "<="
    line = f"{label} differ by {check.spread:.1%} ({relation} the {check.threshold:.0%} threshold); {check.detail}"
    return (("unstable: " if check.unstable else "stable: ") + line) if verdict else line


def pending_repeats(folder: Path, rank: int, n_prompts: int, repeats: int) -> dict[int, int]:
    """The repeat schedule of a rank's ``n_prompts`` prompts less the repeats it already recorded (a resumed run)."""
    done = {r.repeat for r in read_repeats(folder) if r.rank == rank}
    return {position: k for position, k in repeat_schedule(n_prompts, repeats).items() if k not in done}


def record_noise(folder: Path) -> RunInfo:
    """Compute a finished run's noise checks and write them into its ``run.json``."""
    info = RunInfo.load(folder)
    info.noise = noise_checks(read_run(folder), read_repeats(folder), info)
    info.save(folder)
    return info
