"""What a conformance run tests: the tiny target, the prompt, the tokens generated and the draft length, all chosen by
the author (``assert_lossless(family=, vocab=, eos=, prompt=, n_tokens=, gamma=)``). A setting the kit cannot test
exactly is refused with a ``ValueError`` that says why; every verdict names the setting it tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specfamily.testing.tiny import FAMILIES, tiny_target

PROMPT = (1, 2, 3)
GAMMA = 3  # the default constant draft length (tree depth) the kit drives a drafter at, and the depth it must reach
N_TOKENS = 5  # the default tokens per sample at gamma 3: a depth-3 draft after a warm-up pass, plus its bonus token
VOCAB = 8
ENUMERATION_LIMIT = 2**21  # sequences the exact law may enumerate (V ** n_tokens)


@dataclass(frozen=True)
class KitSetting:
    """The tiny target and the run a conformance check samples."""

    family: str = "llama"
    vocab: int = VOCAB
    eos: int | None = None  # the tiny target's end-of-sequence token (None: generation never stops early)
    prompt: tuple[int, ...] = PROMPT
    n_tokens: int = N_TOKENS
    gamma: int | None = GAMMA  # the constant draft length; None: the drafter's own policy
    seed: int = 0  # the tiny target's random seed
    generation: tuple[tuple[str, object], ...] = ()  # generation-config settings (logits processors the law applies)
    sharpened: int = 0  # rounds the kit sharpened the target toward the drafter's proposals (construction.py)

    @property
    def depth(self) -> int:
        """The deepest level the level-conditional tests look at: gamma, or every level the budget allows."""
        return self.gamma if self.gamma is not None else self.n_tokens - 1

    def check(self, min_depth: int) -> None:
        """Raise ``ValueError`` naming the problem unless the kit can test this setting to ``min_depth``."""
        if self.family not in FAMILIES:
            raise ValueError(f"unknown tiny family {self.family!r}; known: {FAMILIES}")
        if self.vocab < 2 or self.n_tokens < 1:
            raise ValueError(f"need vocab >= 2 and n_tokens >= 1, got vocab {self.vocab}, n_tokens {self.n_tokens}")
        if self.vocab**self.n_tokens > ENUMERATION_LIMIT:
            raise ValueError(
                f"vocab {self.vocab} and n_tokens {self.n_tokens} make {self.vocab ** self.n_tokens:,} sequences to "
                f"enumerate for the exact law; the kit's limit is {ENUMERATION_LIMIT:,} (vocab ** n_tokens): lower "
                f"vocab or n_tokens")
        if self.eos is not None and not 0 <= self.eos < self.vocab:
            raise ValueError(f"eos must be a token id in [0, {self.vocab}), got {self.eos}")
        if not self.prompt or not all(0 <= token < self.vocab for token in self.prompt):
            raise ValueError(f"the prompt must be non-empty token ids in [0, {self.vocab}), got {self.prompt}")
        if self.gamma is not None and self.gamma < 1:
            raise ValueError(f"gamma must be >= 1 (or None: the drafter's own policy), got {self.gamma}")
        if self.gamma is not None and self.n_tokens < self.gamma + 1:
            raise ValueError(
                f"n_tokens {self.n_tokens} leaves no room for a depth-{self.gamma} draft: the loop drafts at most "
                f"the tokens left minus one, so gamma {self.gamma} needs n_tokens >= {self.gamma + 1} "
                f"({self.gamma + 2} for a drafter that drafts from its second pass, as feature drafters do)")
        if self.gamma is not None and min_depth > self.gamma:
            raise ValueError(f"min_depth ({min_depth}) cannot exceed the draft length gamma ({self.gamma})")
        if min_depth > self.n_tokens - 1:
            raise ValueError(f"min_depth {min_depth} needs n_tokens >= {min_depth + 1}, got {self.n_tokens}")

    def target(self):
        """A fresh tiny float64 target of this setting (its generation config's EOS set when ``eos`` is given)."""
        generation = dict(self.generation)
        if self.eos is not None:
            generation["eos_token_id"] = self.eos
        return tiny_target(self.family, self.vocab, seed=self.seed, generation=generation)

    def describe(self) -> str:
        eos = "no EOS" if self.eos is None else f"EOS {self.eos}"
        length = "the drafter's own policy" if self.gamma is None else f"gamma {self.gamma}"
        processors = "".join(f", {name} {value}" for name, value in self.generation)
        if self.sharpened:
            processors += f", sharpened toward the drafter's proposals in {self.sharpened} round(s)"
        return (f"tiny {self.family} target (vocabulary {self.vocab}, {eos}, seed {self.seed}{processors}), prompt "
                f"{tuple(self.prompt)}, {self.n_tokens} new tokens, {length}")


def make_setting(family: str, vocab: int, eos: int | None, prompt: Sequence[int], n_tokens: int | None,
                 gamma: int | None, min_depth: int | None,
                 generation: dict | None = None) -> tuple[KitSetting, int]:
    """The checked setting and the depth to hold to power (defaults: n_tokens = gamma + 2, min_depth = gamma)."""
    if n_tokens is None:
        n_tokens = N_TOKENS if gamma is None else gamma + 2
    if min_depth is None:
        min_depth = GAMMA if gamma is None else gamma
        min_depth = min(min_depth, n_tokens - 1)
    setting = KitSetting(family, vocab, eos, tuple(int(t) for t in prompt), n_tokens, gamma,
                         generation=tuple((generation or {}).items()))
    setting.check(min_depth)
    return setting, min_depth
