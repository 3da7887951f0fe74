"""Options of the lookahead drafter."""

from __future__ import annotations

from dataclasses import dataclass


def _check_int(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class LookaheadConfig:
    """Lookahead decoding (Fu et al., ICML 2024): W x (N - 1) Jacobi guesses and up to G pool candidates per pass.

    ``window`` (W): positions of the lookahead branch; ``ngram`` (N): the n-gram size, so N - 1 Jacobi levels and
    candidates of N - 1 tokens; ``guesses`` (G): pool candidates verified at once (1 = a chain of the most recent
    one, more = their token tree). ``gamma``: the candidates' length (the tree depth), at most N - 1 (default
    N - 1, a constant policy: the lookahead branch only runs in passes that draft, so a policy that drafts nothing
    also stops the Jacobi iteration). ``prompt_pool``: also put the n-grams of the prompt and the committed text in
    the pool (the reference's pool-from-prompt option). ``seed``: the window's initial guesses (tokens of the prompt).
    A pass feeds W * (N - 1) side rows and up to G * (N - 1) draft nodes. The defaults (W 1, N 3, G 1: at most 2
    side rows and a chain of 2) are chosen for a CPU, where every fed row costs (docs/lookahead.md); the reference's
    (W 7, N 5, G 7: up to 56 rows a pass) pay where a pass of that many rows costs about one row's.
    """

    gamma: int | None = None  # candidate length / tree depth (default ngram - 1)
    policy: str | None = None  # None: constant; auto | heuristic | optimal
    window: int = 1
    ngram: int = 3
    guesses: int = 1
    prompt_pool: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.gamma is not None:
            _check_int(self.gamma, "gamma", 1)
        _check_int(self.window, "window", 1)
        _check_int(self.ngram, "ngram", 2)
        _check_int(self.guesses, "guesses", 1)
        _check_int(self.seed, "seed", 0)
        if not isinstance(self.prompt_pool, bool):
            raise ValueError(f"prompt_pool must be a boolean, got {self.prompt_pool!r}")
        if self.policy is not None and not isinstance(self.policy, str):
            raise ValueError(f"policy must be a string, got {self.policy!r}")
