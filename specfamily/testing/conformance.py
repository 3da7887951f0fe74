"""The lossless conformance suite: sampled tokens against the exact target law, at the depth the author chooses.

``factory(target) -> Drafter``. The suite builds its own tiny random target (by default a float64 Llama with
vocabulary 8 and no EOS; ``family``, ``vocab``, ``eos``, ``prompt``, ``n_tokens`` and ``gamma`` are the author's
choice, :mod:`specfamily.testing.setting`), so the exact law of the first ``n_tokens`` generated tokens can be
enumerated. It generates ``samples`` sequences (seed i for the i-th) with the drafter wrapped in a
:class:`DepthRecorder` and runs, at the Bonferroni level of the call (``significance`` over every test of every
config):

- every position's marginal, every adjacent pair and the joint (2n chi-square tests): a single test of the joint has
  little power, and an error at one position shows in its marginal;
- for each level 0..gamma, the tokens decided at that level against their own prefixes' p, pooled in token and in
  rank space (:mod:`specfamily.testing.levels`): an error a drafter makes only at depth L shows there undiluted.

Reaching depth: the loop caps gamma at the tokens left minus one, and feature drafters propose nothing on the first
pass, so ``n_tokens`` defaults to gamma + 2. Samples (:mod:`specfamily.testing.sizing`): enough for power 0.99
against a total-variation deviation of 0.1 at any position, and as many (up to ``max_samples``) as power
``depth_power`` against a deviation of 0.1 at level ``min_depth`` (default gamma) needs, measured by a pilot on other
seeds. Where drafts seldom get that deep, the kit chooses a prompt and a target on which they do
(:mod:`specfamily.testing.construction`, pilot data only); a depth it still cannot reach passes with a
:class:`ConformanceWarning` that says what was and was not tested (``require_depth=True``: a failure instead).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specfamily.core.types import SamplingConfig
from specfamily.core.verify import DraftProbabilityError
from specfamily.testing.construction import Plan, plan_run
from specfamily.testing.depth import DepthStats
from specfamily.testing.greedy import assert_greedy_equivalent
from specfamily.testing.levels import conditional_laws, level_tests
from specfamily.testing.power import (
    DEFAULT_DELTA,
    DEFAULT_DEPTH_POWER,
    DEFAULT_SIGNIFICANCE,
    detection_power,
    level_power,
    tests_per_run,
)
from specfamily.testing.sampling_run import Samples, exact_steps, joint_law, sample_run
from specfamily.testing.setting import GAMMA, N_TOKENS, PROMPT, VOCAB, KitSetting, make_setting
from specfamily.testing.sizing import MAX_SAMPLES, PILOT_SAMPLES, PILOT_SEED, Budget
from specfamily.testing.stats import ChiSquare, chi_square, impossible_samples, pool_cells, sequence_tests
from specfamily.testing.tiny import FAMILIES, single_thread, tiny_model

__all__ = [
    "GAMMA", "MAX_SAMPLES", "N_TOKENS", "PILOT_SAMPLES", "PILOT_SEED", "PROMPT", "SAMPLING_MATRIX",
    "ConformanceError", "ConformanceWarning", "FitResult", "assert_greedy_equivalent", "assert_lossless",
    "check_fit", "chi_square", "draft_model_for", "exact_distribution", "pool_cells", "sample_sequences",
    "single_thread",
]

SAMPLING_MATRIX = (
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_p=0.9),
    SamplingConfig(temperature=1.0, top_k=5),
)


class ConformanceWarning(UserWarning):
    """A conformance run that passed without reaching the power it was asked for at some depth: it says what was
    and was not tested."""


@dataclass
class FitResult:
    """One sampling config's verdict. ``p_value`` is the Bonferroni-adjusted smallest p-value of its tests."""

    sampling: SamplingConfig
    chi2: float  # of the most significant test
    p_value: float  # min(1, tests * smallest p-value): the run passes when it is >= significance
    impossible: int  # samples that landed on sequences of probability 0
    cells: int  # of the most significant test
    tests: list[ChiSquare]
    depth: DepthStats | None  # None for plain decoding
    samples: int
    n_tokens: int
    power: float  # lower bound on the power against a deviation of delta at one position
    min_depth: int = 0
    depth_share: float | None = None  # share of samples whose verifier tried a node min_depth deep (None: no drafter)
    depth_power: float | None = None  # power against a deviation of delta at level min_depth (its own tokens)
    delta: float = DEFAULT_DELTA
    vocab: int = VOCAB
    setting: KitSetting | None = None
    significance: float = DEFAULT_SIGNIFICANCE  # this config's share of the call's family-wise level
    level_tokens: list[int] = field(default_factory=list)  # tokens decided at level 0, 1, ..., gamma
    level_power: list[float] = field(default_factory=list)  # power against a deviation of delta at each level
    untested_depths: list[int] = field(default_factory=list)  # levels 1..min_depth below the power asked for
    construction: str = ""  # how the kit chose the target ("": the setting's own)
    look: tuple[int, int] = (1, 1)  # (this look, looks planned): a long run is looked at after its base samples too

    @property
    def passed(self) -> bool:
        """No impossible sample and no test below the level (a nan p-value fails too)."""
        return not self.impossible and self.p_value >= self.significance

    @property
    def worst(self) -> ChiSquare:
        return min(self.tests, key=lambda test: test.p_value)

    def describe(self) -> str:
        worst = self.worst
        setting = "" if self.setting is None else f"{self.setting.describe()}; "
        levels = ", ".join(f"{level}: {tokens} ({power:.2f})" for level, (tokens, power)
                           in enumerate(zip(self.level_tokens, self.level_power, strict=True)))
        depth = "no drafter" if self.depth is None else self.depth.summary()
        chosen = f"; {self.construction}" if self.construction else ""
        look = f" (look {self.look[0]} of {self.look[1]})" if self.look[1] > 1 else ""
        return (f"{setting}{self.sampling}: {self.samples} samples{look} of {self.n_tokens} tokens; most significant: "
                f"{worst.name}, chi2 {worst.chi2:.1f} over {worst.cells} cells, p {worst.p_value:.2e} (adjusted "
                f"{self.p_value:.2e}, significance {self.significance:.1e}); {self.impossible} impossible samples; "
                f"tokens by level (power against total variation {self.delta} there) {levels}; {depth}{chosen}")


class ConformanceError(AssertionError):
    """A failed conformance run; ``fit`` holds its tests and depths (None when the run could not finish)."""

    def __init__(self, message: str, fit: FitResult | None) -> None:
        super().__init__(message)
        self.fit = fit


def exact_distribution(target, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig,
                       chunk: int = 4096) -> torch.Tensor:
    """(V ** n_tokens,) probability of each sequence of the next n_tokens under the processed, warped p (the
    law's own implementation, :func:`specfamily.testing.sampling_run.exact_steps`; EOS absorbing)."""
    return joint_law(exact_steps(target, prompt, n_tokens, sampling, chunk))


def sample_sequences(target, drafter, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig, samples: int,
                     gamma: int | None = None, first_seed: int = 0) -> tuple[torch.Tensor, DepthStats | None]:
    """(samples, n_tokens) generated tokens (seed ``first_seed + i`` for row i; EOS-padded) and the depths the
    drafter reached; ``gamma``: drive the drafter at that constant draft length (None: its own policy)."""
    run = sample_run(target, drafter, prompt, n_tokens, sampling, samples, gamma, first_seed)
    return run.sequences, run.depth


def check_fit(factory: Callable, sampling: SamplingConfig, *, family: str = "llama", n_tokens: int | None = None,
              samples: int | None = None, prompt: Sequence[int] = PROMPT, generation: dict | None = None,
              significance: float = DEFAULT_SIGNIFICANCE, delta: float = DEFAULT_DELTA, gamma: int | None = GAMMA,
              min_depth: int | None = None, depth_power: float = DEFAULT_DEPTH_POWER,
              max_samples: int = MAX_SAMPLES, vocab: int = VOCAB, eos: int | None = None,
              configs: int = 1) -> FitResult:
    """Sample with ``factory``'s drafter on a fresh tiny target and run every test of one sampling config.

    ``significance`` is the call's family-wise level, shared by its ``configs`` sampling configs. ``samples`` None:
    sized by :class:`specfamily.testing.sizing.Budget` from a pilot on other seeds. ``n_tokens`` None: gamma + 2;
    ``min_depth`` None: gamma (0: no depth sizing)."""
    setting, min_depth = make_setting(family, vocab, eos, prompt, n_tokens, gamma, min_depth, generation)
    if samples is not None and samples < 10:
        raise ValueError(f"samples must be >= 10 (or None: sized by the kit), got {samples}")
    tests = tests_per_run(setting.n_tokens, setting.depth + 1)
    budget = Budget(significance / configs, tests, vocab, delta, depth_power, min_depth, max_samples)
    with single_thread():
        plan = plan_run(factory, setting, sampling, budget, samples)
        return _run_and_test(plan, sampling)


def _run_and_test(plan: Plan, sampling: SamplingConfig) -> FitResult:
    """Sample the plan's run look by look (seeds 0, 1, ... in order) and test it at each look; a plainly wrong
    drafter fails at its first."""
    setting = plan.setting
    steps = exact_steps(plan.target, setting.prompt, setting.n_tokens, sampling)
    run = None
    for look, size in enumerate(plan.budget.schedule(plan.samples)):
        done = 0 if run is None else len(run.sequences)
        more = sample_run(plan.target, plan.drafter, setting.prompt, setting.n_tokens, sampling, size - done,
                          setting.gamma, first_seed=done, stats=None if run is None else run.depth)
        run = more if run is None else run.extended(more)
        fit = _evaluate(run, steps, plan, sampling, look)
        if not fit.passed:
            break
    return fit


def _evaluate(run: Samples, steps: list[torch.Tensor], plan: Plan, sampling: SamplingConfig, look: int) -> FitResult:
    """Every test of one run (at its ``look``-th look), and what it had power against."""
    setting, budget = plan.setting, plan.budget
    joint = joint_law(steps)
    tests = sequence_tests(run.sequences, joint, setting.vocab)
    levels, counts = level_tests(run.sequences, run.levels, conditional_laws(steps, run.sequences), setting.depth)
    tests += levels
    worst = min(tests, key=lambda test: test.p_value)
    samples, alpha, delta, min_depth = len(run.sequences), budget.alpha, budget.delta, budget.min_depth
    powers = [level_power(tokens, delta, setting.vocab, alpha) for tokens in counts]
    depth = run.depth
    untested = [] if depth is None else [d for d in range(1, min_depth + 1) if powers[d] < budget.depth_power]
    adjusted = min(1.0, budget.tests * budget.looks * worst.p_value)
    return FitResult(
        sampling, worst.chi2, adjusted, impossible_samples(run.sequences, joint, setting.vocab), worst.cells, tests,
        depth, samples, setting.n_tokens, detection_power(samples, delta, setting.vocab, alpha), min_depth,
        None if depth is None else depth.share_verified(min_depth),
        None if depth is None or not min_depth else powers[min_depth], delta, setting.vocab, setting,
        budget.significance, counts, powers, untested, plan.note, (look + 1, budget.looks))


def assert_lossless(factory: Callable, *, configs: Sequence[SamplingConfig] = SAMPLING_MATRIX,
                    family: str = "llama", n_tokens: int | None = None, samples: int | None = None,
                    significance: float = DEFAULT_SIGNIFICANCE, gamma: int | None = GAMMA,
                    min_depth: int | None = None, depth_power: float = DEFAULT_DEPTH_POWER,
                    max_samples: int = MAX_SAMPLES, prompt: Sequence[int] = PROMPT, generation: dict | None = None,
                    vocab: int = VOCAB, eos: int | None = None, require_depth: bool = False) -> list[FitResult]:
    """Fail unless generations with the drafter follow the target's exact law under each config (family-wise
    level ``significance`` over the whole call); warn (``require_depth``: fail) when a run lacked ``depth_power``
    against an error that appears only ``min_depth`` deep (plain decoding, ``factory`` returning None, is not
    checked for depth).

    The drafter is driven at the constant draft length ``gamma`` whatever its own policy (a cost-aware policy that
    drafts nothing would leave nothing to test); ``gamma=None`` keeps its policy. ``n_tokens`` (default gamma + 2),
    ``family``, ``vocab``, ``eos`` and ``prompt`` set the tiny target and the run; ``generation``: settings for its
    generation config (``{"repetition_penalty": 1.3}``): the law is then the processed one. ``min_depth`` (default
    gamma; 0 skips the depth check) is the level held to ``depth_power``."""
    setting, _ = make_setting(family, vocab, eos, prompt, n_tokens, gamma, min_depth, generation)  # refused early
    results = []
    for sampling in configs:
        try:
            fit = check_fit(factory, sampling, family=family, n_tokens=n_tokens, samples=samples, prompt=prompt,
                            significance=significance, gamma=gamma, min_depth=min_depth, depth_power=depth_power,
                            max_samples=max_samples, generation=generation, vocab=vocab, eos=eos,
                            configs=len(configs))
        except DraftProbabilityError as err:  # the verifier met a token the drafter's own q rules out
            raise ConformanceError(f"not lossless under {sampling} ({setting.describe()}): {err}", None) from err
        if not fit.passed:
            raise ConformanceError(f"not lossless under {fit.describe()}", fit)
        if fit.untested_depths:
            message = _untested_message(fit, depth_power)
            if require_depth:
                raise ConformanceError(message, fit)
            warnings.warn(ConformanceWarning(message), stacklevel=2)
        results.append(fit)
    return results


def _untested_message(fit: FitResult, depth_power: float) -> str:
    depths = ", ".join(str(d) for d in fit.untested_depths)
    level = fit.untested_depths[-1]
    tokens, power = fit.level_tokens[level], fit.level_power[level]
    return (f"depth {depths} not tested to power {depth_power}: {tokens} tokens of {fit.samples} samples were decided "
            f"at level {level} (power {power:.2f} against an error of total variation {fit.delta} there); the tests "
            f"passed, but an error that appears only that deep may have gone unseen. Draft deeper drafts that are "
            f"accepted more often, raise max_samples, or lower min_depth (require_depth=True makes this a failure). "
            f"What was tested: {fit.describe()}")


def draft_model_for(target, seed: int = 1):
    """A second tiny model with the target's family and vocabulary, for small-model drafters in tests."""
    model_type = target.model.config.model_type
    family = model_type if model_type in FAMILIES else "llama"
    return tiny_model(family, target.vocab_size, seed=seed, dtype=target.dtype)
