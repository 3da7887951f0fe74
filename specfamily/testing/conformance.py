"""The lossless conformance suite: sampled tokens against the exact target law, at the drafter's full depth.

``factory(target) -> Drafter``. The suite builds its own tiny random target (vocabulary 8, float64), so the exact
law of the first ``n_tokens`` generated tokens can be enumerated (8 ** 5 sequences by default). It generates
``samples`` sequences (seed i for the i-th) with the drafter wrapped in a :class:`DepthRecorder`, and runs 2n
chi-square tests: every position's marginal, every adjacent pair, and the joint, at the Bonferroni level
``significance / 2n``. A single test of the joint has little power: a drafter whose q is wrong only at depth 3
hides among 8 ** n cells; its position's marginal shows it.

Reaching depth: the loop caps gamma at the tokens left minus one, and feature drafters (EAGLE, Medusa) propose
nothing on the first pass (it is their warm-up: the prefill commits the prompt and hands them its features). With
``n_tokens = 5`` a drafter of depth 3 drafts its full depth on the first pass (or, for a feature drafter, on the
second, rooted after the first sampled token), with a bonus position left. The depth each run actually verified
is in ``FitResult.depth``; ``assert_lossless(min_depth=...)`` fails a run that did not get that deep.

Sample counts come from :mod:`specfamily.testing.power`: by default enough to catch a total-variation deviation
of 0.1 at any one position with probability 0.99 (1339 samples for n = 5, V = 8, significance 1e-3).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specfamily.core.loop import generate
from specfamily.core.types import SamplingConfig
from specfamily.core.verify import DraftProbabilityError
from specfamily.testing.depth import DepthRecorder, DepthStats
from specfamily.testing.greedy import assert_greedy_equivalent
from specfamily.testing.law import reference_process, reference_warp
from specfamily.testing.power import (
    DEFAULT_DELTA,
    DEFAULT_DEPTH_POWER,
    DEFAULT_SIGNIFICANCE,
    depth_samples,
    detection_power,
    run_samples,
    share_for_power,
    share_lower_bound,
    tests_per_run,
)
from specfamily.testing.stats import ChiSquare, chi_square, impossible_samples, pool_cells, sequence_tests
from specfamily.testing.tiny import FAMILIES, single_thread, tiny_model, tiny_target

__all__ = [
    "GAMMA", "N_TOKENS", "PROMPT", "SAMPLING_MATRIX", "ConformanceError", "FitResult", "assert_greedy_equivalent",
    "assert_lossless", "check_fit", "chi_square", "draft_model_for", "exact_distribution", "pool_cells",
    "sample_sequences", "single_thread",
]

SAMPLING_MATRIX = (
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_p=0.9),
    SamplingConfig(temperature=1.0, top_k=5),
)
PROMPT = (1, 2, 3)
N_TOKENS = 5  # a depth-3 draft after the warm-up pass, plus its bonus position
GAMMA = 3  # the constant draft length (tree depth) the kit drives every drafter at, and the depth it must reach
PILOT_SAMPLES = 200  # a pilot run (its own seeds) measures how often drafts reach min_depth, to size the main run
PILOT_SEED = 1_000_000
MAX_SAMPLES = 8000


@dataclass
class FitResult:
    """One sampling config's verdict. ``p_value`` is the Bonferroni-adjusted smallest p-value of the 2n tests."""

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
    depth_power: float | None = None  # power against an error only at min_depth: deviation diluted by depth_share
    delta: float = DEFAULT_DELTA
    vocab: int = 8

    @property
    def worst(self) -> ChiSquare:
        return min(self.tests, key=lambda test: test.p_value)

    def describe(self) -> str:
        worst = self.worst
        depth = "no drafter" if self.depth is None else self.depth.summary()
        if self.depth_power is not None and self.min_depth:
            depth += (f"; power {self.depth_power:.2f} against an error only at depth {self.min_depth} "
                      f"(conditional TV {self.delta}, reached by {self.depth_share:.0%} of samples)")
        return (f"{self.sampling}: {self.samples} samples of {self.n_tokens} tokens; most significant: "
                f"{worst.name}, chi2 {worst.chi2:.1f} over {worst.cells} cells, p {worst.p_value:.2e} "
                f"(adjusted {self.p_value:.2e}); {self.impossible} impossible samples; {depth}")


class ConformanceError(AssertionError):
    """A failed conformance run; ``fit`` holds its tests and depths (None when the run could not finish)."""

    def __init__(self, message: str, fit: FitResult | None) -> None:
        super().__init__(message)
        self.fit = fit


@torch.inference_mode()
def exact_distribution(target, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig,
                       chunk: int = 4096) -> torch.Tensor:
    """(V ** n_tokens,) probability of each sequence of the next n_tokens under warped p.

    The warp is :func:`specfamily.testing.law.reference_warp`, an independent implementation of the sampling
    specification: a bug in the warp the decode loop uses moves the samples, not the law. Before it, the processors
    the target's generation config sets (:func:`specfamily.testing.law.reference_process`, transformers' own)."""
    model, vocab = target.model, target.vocab_size
    probs = torch.ones(1, dtype=torch.float64)
    for length in range(n_tokens):
        prefixes = torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.long)
        prefixes = prefixes.view(vocab**length, length)
        ids = torch.cat([torch.tensor(list(prompt)).expand(vocab**length, -1), prefixes], dim=1)  # (V^len, L+len)
        steps = []
        for batch in ids.split(chunk):
            batch = batch.to(model.device)
            logits = model(input_ids=batch, attention_mask=torch.ones_like(batch)).logits[:, -1]
            logits = reference_process(batch, logits, getattr(model, "generation_config", None), len(prompt))
            steps.append(reference_warp(logits, sampling))  # (batch, V): the law's own warp, not the loop's
        probs = (probs.view(-1, 1) * torch.cat(steps)).reshape(-1)
    return probs


def sample_sequences(target, drafter, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig, samples: int,
                     gamma: int | None = None, first_seed: int = 0) -> tuple[torch.Tensor, DepthStats | None]:
    """(samples, n_tokens) generated tokens (seed ``first_seed + i`` for row i) and the depths the drafter reached;
    ``gamma``: drive the drafter at that constant draft length (None: its own policy)."""
    recorder = None if drafter is None else DepthRecorder(drafter, gamma=gamma)
    rows = []
    for seed in range(first_seed, first_seed + samples):
        tokens = generate(target, recorder, list(prompt), max_new_tokens=n_tokens, sampling=sampling,
                          seed=seed).tokens
        if len(tokens) != n_tokens:
            raise ValueError(f"generation {seed} stopped after {len(tokens)} of {n_tokens} tokens (an EOS?): "
                             "the conformance target must not have an end-of-sequence token")
        rows.append(tokens)
    return torch.tensor(rows, dtype=torch.long), (None if recorder is None else recorder.stats)


def check_fit(factory: Callable, sampling: SamplingConfig, *, family: str = "llama", n_tokens: int = N_TOKENS,
              samples: int | None = None, prompt: Sequence[int] = PROMPT, generation: dict | None = None,
              significance: float = DEFAULT_SIGNIFICANCE, delta: float = DEFAULT_DELTA, gamma: int | None = GAMMA,
              min_depth: int = GAMMA, depth_power: float = DEFAULT_DEPTH_POWER,
              max_samples: int = MAX_SAMPLES) -> FitResult:
    """Sample with ``factory``'s drafter on a fresh tiny target and test marginals, pairs and the joint.

    ``gamma``: the constant draft length the drafter is driven at (None: its own policy, which may draft nothing).
    ``samples`` None: the marginal power default, raised (up to ``max_samples``) to what ``depth_power`` against a
    ``min_depth``-only error needs at the share of samples a pilot run (other seeds) verified that deep."""
    with single_thread():
        target = tiny_target(family, generation=generation)
        vocab, level = target.vocab_size, significance / tests_per_run(n_tokens)
        drafter = factory(target)
        if samples is None:
            samples = run_samples(vocab, n_tokens, significance, delta)
            if drafter is not None and min_depth > 0:
                _, pilot = sample_sequences(target, drafter, prompt, n_tokens, sampling, PILOT_SAMPLES, gamma,
                                            first_seed=PILOT_SEED)
                share = share_lower_bound(pilot.share_verified(min_depth), PILOT_SAMPLES)
                needed = max_samples + 1 if share <= 0 else depth_samples(share, delta, vocab, level, depth_power)
                samples = max(samples, needed) if needed <= max_samples else samples  # hopeless: fail on the base
        joint = exact_distribution(target, prompt, n_tokens, sampling)
        sequences, depth = sample_sequences(target, drafter, prompt, n_tokens, sampling, samples, gamma)
    tests = sequence_tests(sequences, joint, vocab)
    worst = min(tests, key=lambda test: test.p_value)
    adjusted = min(1.0, len(tests) * worst.p_value)
    power = detection_power(samples, delta, vocab, level)
    share = None if depth is None else depth.share_verified(min_depth)
    reach = None if share is None else detection_power(samples, share * delta, vocab, level)
    return FitResult(sampling, worst.chi2, adjusted, impossible_samples(sequences, joint, vocab), worst.cells,
                     tests, depth, samples, n_tokens, power, min_depth, share, reach, delta, vocab)


def assert_lossless(factory: Callable, *, configs: Sequence[SamplingConfig] = SAMPLING_MATRIX,
                    family: str = "llama", n_tokens: int = N_TOKENS, samples: int | None = None,
                    significance: float = DEFAULT_SIGNIFICANCE, gamma: int | None = GAMMA, min_depth: int = GAMMA,
                    depth_power: float = DEFAULT_DEPTH_POWER, max_samples: int = MAX_SAMPLES,
                    prompt: Sequence[int] = PROMPT, generation: dict | None = None) -> list[FitResult]:
    """Fail unless generations with the drafter follow the target's exact law under each config, and the run had
    ``depth_power`` against an error that appears only ``min_depth`` deep (plain decoding, ``factory`` returning
    None, is not checked for depth).

    The drafter is driven at the constant draft length ``gamma`` whatever its own policy (a cost-aware policy that
    drafts nothing would leave nothing to test); ``gamma=None`` keeps its policy. ``min_depth=0`` skips the depth
    check. ``generation``: settings for the kit target's generation config (``{"repetition_penalty": 1.3}``): the
    law is then the processed one."""
    if gamma is not None and min_depth > gamma:
        raise ValueError(f"min_depth ({min_depth}) cannot exceed the draft length gamma ({gamma})")
    results = []
    for sampling in configs:
        try:
            fit = check_fit(factory, sampling, family=family, n_tokens=n_tokens, samples=samples, prompt=prompt,
                            significance=significance, gamma=gamma, min_depth=min_depth, depth_power=depth_power,
                            max_samples=max_samples, generation=generation)
        except DraftProbabilityError as err:  # the verifier met a token the drafter's own q rules out
            raise ConformanceError(f"not lossless under {sampling}: {err}", None) from err
        if fit.impossible or not fit.p_value >= significance:  # a nan p-value fails too
            raise ConformanceError(f"not lossless under {fit.describe()} (significance {significance})", fit)
        if fit.depth is not None and min_depth > 0 and not fit.depth_power >= depth_power:
            raise ConformanceError(_shallow_message(fit, depth_power, significance), fit)
        results.append(fit)
    return results


def _share_needed(samples: int, share: float) -> str:
    if share > 1:
        return f"no share of {samples} samples suffices"
    return f"{samples} samples need a share >= {share:.0%}"


def _shallow_message(fit: FitResult, depth_power: float, significance: float) -> str:
    level = significance / tests_per_run(fit.n_tokens)
    needed = share_for_power(fit.samples, fit.delta, fit.vocab, level, depth_power)
    return (f"only {fit.depth_share:.1%} of {fit.samples} samples verified a draft node {fit.min_depth} deep: against "
            f"an error that appears only at depth {fit.min_depth} (conditional total variation {fit.delta}, diluted "
            f"to {fit.depth_share * fit.delta:.3f} at its position) the run's power is {fit.depth_power:.2f} < "
            f"{depth_power}; {_share_needed(fit.samples, needed)}. Draft deeper drafts that "
            f"are accepted more often, raise max_samples, or lower min_depth. {fit.describe()}")


def draft_model_for(target, seed: int = 1):
    """A second tiny model with the target's family and vocabulary, for small-model drafters in tests."""
    model_type = target.model.config.model_type
    family = model_type if model_type in FAMILIES else "llama"
    return tiny_model(family, target.vocab_size, seed=seed, dtype=target.dtype)
