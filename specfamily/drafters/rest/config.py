"""Options of the REST drafter (retrieval-based speculative decoding: He et al., NAACL 2024)."""

from __future__ import annotations

import os
from dataclasses import dataclass


def _check_int(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class RestConfig:
    """Retrieval from a datastore of text (:func:`~specfamily.drafters.rest.datastore.build_datastore`).

    ``datastore``: the folder of a built datastore; null: the zoo target's own (in the specfamily cache), built on
    first use from the zoo corpus (``specfamily.drafters.rest.default_store``; or ahead of time with
    ``python -m specfamily.recipes.rest_datastore``). The longest suffix of the context of
    ``min_span``..``max_span`` tokens (reference: 2..16) that occurs in it is looked up; the ``continuation`` tokens
    (reference: 10) after up to ``max_matches`` of its occurrences (reference: 5000, from a GPU; fewer keep a CPU
    pass cheap) are counted, and the ``max_tree_size`` most frequent prefixes (reference: 64) form the token tree.
    """

    gamma: int | None = None  # depth cap of the tree; null: cost-aware (see policy)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    datastore: str | os.PathLike | None = None
    min_span: int = 2
    max_span: int = 16
    continuation: int = 10
    max_matches: int = 512
    max_tree_size: int = 8

    def __post_init__(self) -> None:
        if self.gamma is not None:
            _check_int(self.gamma, "gamma", 1)
        if self.policy is not None and not isinstance(self.policy, str):
            raise ValueError(f"policy must be a string, got {self.policy!r}")
        if self.datastore is not None and not isinstance(self.datastore, (str, os.PathLike)):
            raise ValueError(f"datastore must be a path (a string) or null, got {self.datastore!r}")
        _check_int(self.min_span, "min_span", 1)
        _check_int(self.max_span, "max_span", 1)
        if self.max_span < self.min_span:
            raise ValueError(f"max_span ({self.max_span}) must be >= min_span ({self.min_span})")
        _check_int(self.continuation, "continuation", 1)
        _check_int(self.max_matches, "max_matches", 1)
        _check_int(self.max_tree_size, "max_tree_size", 1)
