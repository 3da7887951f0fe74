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
    A pass feeds W * (N - 1) side rows and up to G * (N - 1) draft nodes.
    """

    gamma: int | None = None  # candidate length / tree depth (default ngram - 1)
    policy: str | None = None  # None: constant; auto | heuristic | optimal
    window: int = 4
    ngram: int = 4
    guesses: int = 4
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
