"""Options of the suffix drafter (SuffixDecoding: Oliaro et al., NeurIPS 2025), with the paper's defaults."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

MODES = ("tree", "chain")
CHOICES = ("score", "match", "own")  # as speculate.CHOICES (kept import-free here)


def _check_int(value: object, name: str, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")


def _check_number(value: object, name: str, minimum: float, maximum: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value <= maximum:
        bound = f"in [{minimum}, {maximum}]" if math.isfinite(maximum) else f">= {minimum}"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")


@dataclass
class SuffixConfig:
    """Suffix tries over this request (prompt + generated) and over earlier requests' outputs.

    ``mode``: ``tree`` (frequency-scored) or ``chain`` (the most frequent continuation). ``max_depth`` (paper: 64):
    the longest substring counted. With ``max_spec_offset`` set, a match of length m proposes up to
    ``floor(max_spec_factor * m + max_spec_offset)`` tokens, at most ``max_tree_size`` (paper: factor 1, offset 0);
    null: at most ``min(gamma, max_tree_size)``. A node is proposed while its path's product of continuation
    frequencies is >= ``min_token_prob`` (paper: 0.1). ``choose``: ``own`` (the global speculation only when the
    request's own has no continuation), ``score`` (the higher score, the paper's rule) or ``match`` (the longer
    match, then the score). ``recency``: break frequency ties by the latest occurrence. ``max_cached_tokens``: the
    global cache's budget (0: off); ``cache_prompts`` adds prompts to it too; ``cache``: a saved cache to start from.
    """

    gamma: int | None = None  # depth cap of the speculation tree; null: cost-aware (see policy)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    mode: str = "tree"
    max_depth: int = 64
    max_spec_factor: float = 1.0
    max_spec_offset: float | None = None
    min_token_prob: float = 0.1
    max_tree_size: int = 16
    max_cached_tokens: int = 16384
    cache_prompts: bool = False
    cache: str | os.PathLike | None = None
    choose: str = "own"
    recency: bool = False

    def __post_init__(self) -> None:
        if self.gamma is not None:
            _check_int(self.gamma, "gamma", 1)
        if self.policy is not None and not isinstance(self.policy, str):
            raise ValueError(f"policy must be a string, got {self.policy!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _check_int(self.max_depth, "max_depth", 2, 255)
        _check_number(self.max_spec_factor, "max_spec_factor", 0.0)
        if self.max_spec_offset is not None:
            _check_number(self.max_spec_offset, "max_spec_offset", -math.inf)
        _check_number(self.min_token_prob, "min_token_prob", 0.0, 1.0)
        _check_int(self.max_tree_size, "max_tree_size", 1)
        _check_int(self.max_cached_tokens, "max_cached_tokens", 0)
        if not isinstance(self.cache_prompts, bool):
            raise ValueError(f"cache_prompts must be true or false, got {self.cache_prompts!r}")
        if not isinstance(self.recency, bool):
            raise ValueError(f"recency must be true or false, got {self.recency!r}")
        if self.choose not in CHOICES:
            raise ValueError(f"choose must be one of {', '.join(CHOICES)}, got {self.choose!r}")
        if self.cache is not None and not isinstance(self.cache, (str, os.PathLike)):
            raise ValueError(f"cache must be a path (a string) or null, got {self.cache!r}")
