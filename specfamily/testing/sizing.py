"""How many samples a conformance run takes: the marginals' power, then the power at the depth it must reach.

A pilot on its own seeds counts the tokens each sample decides at level ``min_depth``; the run takes as many samples
as ``depth_power`` against an error of total variation ``delta`` there needs (:func:`.power.level_power`), up to
``max_samples``; :mod:`specfamily.testing.construction` sharpens the target when drafts seldom get that deep. A
long run is looked at after ``base_samples`` and at the end, each at half the level (Bonferroni), so a plainly wrong
drafter fails early.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specfamily.testing.power import DEFAULT_POWER, rate_lower_bound, samples_for_power
from specfamily.testing.sampling_run import sample_run

PILOT_SAMPLES = 200  # a pilot run (its own seeds) measures how often drafts reach min_depth, to size the main run
PILOT_SEED = 1_000_000
MAX_SAMPLES = 8000


LOOK_AGAIN = 1.5  # a run this many times longer than base_samples is looked at twice


@dataclass(frozen=True)
class Budget:
    """What one sampling config's run must achieve: the level of each test and the powers asked for."""

    significance: float  # this config's share of the call's family-wise level
    tests: int  # tests per look
    vocab: int
    delta: float
    depth_power: float
    min_depth: int
    max_samples: int = MAX_SAMPLES
    looks: int = 1  # looks at the data: 2 for a run much longer than base_samples

    @property
    def alpha(self) -> float:
        """The Bonferroni level of each test at each look."""
        return self.significance / self.tests / self.looks

    @property
    def base_samples(self) -> int:
        """Samples for power 0.99 against a deviation ``delta`` at any one position's marginal."""
        return samples_for_power(self.delta, self.vocab, self.alpha, DEFAULT_POWER)

    @property
    def level_tokens(self) -> int:
        """Tokens at level ``min_depth`` that give ``depth_power`` against a deviation ``delta`` there."""
        return samples_for_power(self.delta, self.vocab, self.alpha, self.depth_power)

    def samples_at(self, rate: float) -> int | None:
        """Samples needed when each decides ``rate`` tokens at level ``min_depth`` (None: more than allowed)."""
        if rate <= 0:
            return None
        needed = max(self.base_samples, math.ceil(self.level_tokens / rate))
        return needed if needed <= self.max_samples else None

    def sized(self, rate: float) -> tuple[Budget, int] | None:
        """The budget (one look, or two for a long run) and the samples for a pilot's ``rate``; None: out of reach."""
        needed = self.samples_at(rate)
        if needed is None or needed <= LOOK_AGAIN * self.base_samples:
            return None if needed is None else (self, needed)
        twice = replace(self, looks=2)
        again = twice.samples_at(rate)
        return None if again is None else (twice, again)

    def schedule(self, samples: int) -> list[int]:
        """The sample counts at which the run is looked at."""
        first = self.base_samples
        return [first, samples] if self.looks == 2 and first < samples else [samples]


@dataclass(frozen=True)
class Pilot:
    """A pilot's measurement at level ``min_depth``: tokens per sample (mean and lower bound)."""

    samples: int
    mean: float
    rate: float  # the lower bound the run is sized with

    def describe(self, level: int) -> str:
        return f"a pilot of {self.samples} samples decided {self.mean:.2f} tokens per sample at level {level}"


def pilot(target, drafter, setting, sampling, level: int, samples: int = PILOT_SAMPLES,
          first_seed: int = PILOT_SEED, keep_drafts: bool = False) -> tuple[Pilot, list]:
    """Sample ``samples`` requests on pilot seeds and measure the tokens each decides at ``level``; the drafts
    (context, draft) it recorded when ``keep_drafts``."""
    run = sample_run(target, drafter, setting.prompt, setting.n_tokens, sampling, samples, setting.gamma,
                     first_seed=first_seed, keep_drafts=keep_drafts)
    counts = run.level_counts(level).tolist()
    return Pilot(samples, sum(counts) / max(samples, 1), rate_lower_bound(counts)), run.drafts or []
