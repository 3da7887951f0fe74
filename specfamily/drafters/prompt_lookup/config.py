"""Options of the prompt-lookup drafter."""

from __future__ import annotations

from dataclasses import dataclass

GREEDY_BRANCHES = 1  # the default branches under greedy decoding (a chain)
SAMPLED_BRANCHES = 2  # the default branches when sampling


def resolve_branches(branches: int | None, greedy: bool) -> int:
    """The branches to propose: the option when set, else the default for greedy decoding or for sampling."""
    if branches is not None:
        return branches
    return GREEDY_BRANCHES if greedy else SAMPLED_BRANCHES


def _check_int(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class PromptLookupConfig:
    """n-gram lookup in prompt + generated text (Saxena 2023; transformers' ``prompt_lookup_num_tokens``).

    ``gamma`` (default 10, as transformers): tokens copied per branch, the tree depth when
    ``branches`` > 1. A copied run tends to be right for many tokens or wrong at the first, and
    on a CPU a pass that carries a draft at all pays little more for a longer one (the
    t(n)/t(1) curve this default was chosen on: docs/results.md). Measure t(n)/t(1) for your
    target before changing it. ``min_ngram``/``max_ngram``: the n-gram sizes matched, longest
    first (transformers: 1 to 2). ``branches``: distinct earlier matches proposed at once as a
    token tree (1 = a chain); the tree has up to branches * gamma nodes and is verified in the
    same single pass. None (the default): :data:`GREEDY_BRANCHES` under greedy decoding,
    :data:`SAMPLED_BRANCHES` when sampling (:func:`resolve_branches`): a copied token is accepted
    with probability p(x) when sampling, and a second candidate at a position is tried against
    what the first's rejection left (docs/results.md, "session 22: sampled drafting").
    """

    gamma: int | None = None  # draft length / tree depth (default 10)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    min_ngram: int = 1
    max_ngram: int = 3
    branches: int | None = None  # None: GREEDY_BRANCHES greedy, SAMPLED_BRANCHES sampling

    def __post_init__(self) -> None:
        if self.gamma is not None:
            _check_int(self.gamma, "gamma", 1)
        _check_int(self.min_ngram, "min_ngram", 1)
        _check_int(self.max_ngram, "max_ngram", 1)
        if self.max_ngram < self.min_ngram:
            raise ValueError(f"max_ngram ({self.max_ngram}) must be >= min_ngram ({self.min_ngram})")
        if self.branches is not None:
            _check_int(self.branches, "branches", 1)
        if self.policy is not None and not isinstance(self.policy, str):
            raise ValueError(f"policy must be a string, got {self.policy!r}")
