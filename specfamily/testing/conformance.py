"""The lossless conformance suite: chi-square of generated tokens against the exact target law.

``factory(target) -> Drafter``. The suite builds its own tiny random target (vocabulary 8), so the
exact distribution of the first ``n_tokens`` generated tokens can be enumerated, samples
``samples`` generations (seed i for the i-th), and runs a chi-square goodness-of-fit test.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from scipy import stats

from specfamily.core.loop import generate
from specfamily.core.sampling import warp
from specfamily.core.types import SamplingConfig
from specfamily.testing.tiny import FAMILIES, tiny_model, tiny_target

SAMPLING_MATRIX = (
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_p=0.9),
    SamplingConfig(temperature=1.0, top_k=5),
)
PROMPT = (1, 2, 3)


@dataclass
class FitResult:
    sampling: SamplingConfig
    chi2: float
    p_value: float
    impossible: int  # samples that landed on sequences of probability 0
    cells: int


@torch.inference_mode()
def exact_distribution(target, prompt: Sequence[int], n_tokens: int, sampling: SamplingConfig) -> torch.Tensor:
    """(V ** n_tokens,) probability of each sequence of the next n_tokens under warped p."""
    model, vocab = target.model, target.vocab_size
    probs = torch.ones(1, dtype=torch.float64)
    for length in range(n_tokens):
        prefixes = list(itertools.product(range(vocab), repeat=length))
        ids = torch.tensor([list(prompt) + list(pre) for pre in prefixes], device=model.device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1]
        step = warp(logits, sampling).double().cpu()  # (V ** length, V)
        probs = (probs.view(-1, 1) * step).reshape(-1)
    return probs


def empirical_counts(target, drafter, prompt, n_tokens: int, sampling: SamplingConfig, samples: int) -> torch.Tensor:
    vocab = target.vocab_size
    counts = torch.zeros(vocab**n_tokens, dtype=torch.float64)
    for seed in range(samples):
        tokens = generate(target, drafter, list(prompt), max_new_tokens=n_tokens, sampling=sampling, seed=seed).tokens
        index = 0
        for token in tokens:
            index = index * vocab + token
        counts[index] += 1
    return counts


def pool_cells(observed: torch.Tensor, expected: torch.Tensor, min_expected: float = 5.0):
    """Merge the smallest cells, in order of expected count, into buckets of expected >= min_expected."""
    order = torch.argsort(expected)
    obs_buckets, exp_buckets = [], []
    obs_acc = exp_acc = 0.0
    for index in order.tolist():
        obs_acc += float(observed[index])
        exp_acc += float(expected[index])
        if exp_acc >= min_expected:
            obs_buckets.append(obs_acc)
            exp_buckets.append(exp_acc)
            obs_acc = exp_acc = 0.0
    if exp_acc > 0 or obs_acc > 0:  # a short last bucket joins the one before it
        if exp_buckets:
            obs_buckets[-1] += obs_acc
            exp_buckets[-1] += exp_acc
        else:
            obs_buckets.append(obs_acc)
            exp_buckets.append(exp_acc)
    return torch.tensor(obs_buckets), torch.tensor(exp_buckets)


def chi_square(observed: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Goodness of fit after pooling small cells: (chi2, p-value, cells). Needs at least two cells."""
    obs, exp = pool_cells(observed, probs * observed.sum(), min_expected)
    if obs.numel() < 2:
        raise ValueError(f"{int(observed.sum())} samples are too few for a chi-square test: raise `samples`")
    result = stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item())
    return float(result.statistic), float(result.pvalue), int(obs.numel())


def check_fit(factory: Callable, sampling: SamplingConfig, *, family: str = "llama", n_tokens: int = 3,
              samples: int = 2000, prompt: Sequence[int] = PROMPT) -> FitResult:
    target = tiny_target(family)
    drafter = factory(target)
    probs = exact_distribution(target, prompt, n_tokens, sampling)
    counts = empirical_counts(target, drafter, prompt, n_tokens, sampling, samples)
    impossible = int(counts[probs == 0].sum())
    chi2, p_value, cells = chi_square(counts, probs)
    return FitResult(sampling, chi2, p_value, impossible, cells)


def assert_lossless(factory: Callable, *, configs: Sequence[SamplingConfig] = SAMPLING_MATRIX,
                    family: str = "llama", n_tokens: int = 3, samples: int = 2000,
                    significance: float = 1e-3) -> list[FitResult]:
    """Fail unless generations with the drafter follow the target's exact distribution under each config."""
    results = []
    for sampling in configs:
        fit = check_fit(factory, sampling, family=family, n_tokens=n_tokens, samples=samples)
        if fit.impossible or not fit.p_value >= significance:  # a nan p-value fails too
            raise AssertionError(
                f"not lossless under {sampling}: chi2 {fit.chi2:.1f} over {fit.cells} cells, "
                f"p-value {fit.p_value:.2e} < {significance}, {fit.impossible} impossible samples"
            )
        results.append(fit)
    return results


def draft_model_for(target, seed: int = 1):
    """A second tiny model with the target's family and vocabulary, for small-model drafters in tests."""
    model_type = target.model.config.model_type
    family = model_type if model_type in FAMILIES else "llama"
    return tiny_model(family, target.vocab_size, seed=seed, dtype=target.dtype)


@torch.inference_mode()
def assert_greedy_equivalent(factory: Callable, *, families: Sequence[str] = ("llama", "gpt2"),
                             vocab_size: int = 64, prompts: int = 4, max_new_tokens: int = 24) -> None:
    """Fail unless greedy generation with the drafter equals transformers' greedy generate, token for token."""
    for family in families:
        target = tiny_target(family, vocab_size=vocab_size, spread=1.0)
        drafter = factory(target)
        gen = torch.Generator().manual_seed(0)
        for i in range(prompts):
            prompt = torch.randint(0, vocab_size, (3 + 5 * i,), generator=gen)
            ids = prompt.view(1, -1)
            reference = target.model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, pad_token_id=0,
            )[0, ids.shape[1] :].tolist()
            ours = generate(target, drafter, prompt, max_new_tokens=max_new_tokens).tokens
            if ours != reference:
                raise AssertionError(f"{family} prompt {i}: greedy tokens differ\n ours {ours}\n ref  {reference}")
