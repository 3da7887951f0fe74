"""Options of the merge drafter: which registered drafters it merges, each one's own options, the draft depth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PARTS = ("suffix", "eagle3")
CREDITS = ("marginal", "own")  # what a part's own policy is credited (drafters/merge/policy.py)


@dataclass
class MergeConfig:
    """``parts``: registered drafter names (or, from Python, drafter objects), laid into the tree in this order;
    ``options``: each named part's own options (``{"eagle3": {"total_tokens": 8}}``), checked against its schema;
    a part's ``gamma`` there caps its depth (else its own default does). ``min_tokens``: a part drafts only while
    the parts before it proposed fewer tokens than this (SAM-Decoding's switch: the model drafts where retrieval
    found nothing); None: every part drafts every pass. ``gamma``/``policy``: the merged draft's depth, as every
    drafter's (None: cost-aware). ``credit``: with the parts' own policies (no merged gamma or policy), what a part's
    policy is told it got accepted: ``marginal``, the tokens beyond the earlier parts' paths; ``own``, its own path's
    (as if it had drafted alone)."""

    parts: Any = field(default_factory=lambda: list(DEFAULT_PARTS))
    options: Any = None
    gamma: int | None = None
    policy: str | None = None
    min_tokens: int | None = None
    credit: str = "marginal"

    def __post_init__(self) -> None:
        if isinstance(self.parts, (str, bytes)) or not isinstance(self.parts, Sequence) or not self.parts:
            raise ValueError(f"merge parts must be a non-empty list of drafter names, got {self.parts!r}")
        self.parts = list(self.parts)
        names = [part for part in self.parts if isinstance(part, str)]
        if "merge" in names:
            raise ValueError("merge parts cannot include merge itself")
        if len(set(names)) != len(names):
            raise ValueError(f"merge parts name a drafter twice: {names!r}")
        options = {} if self.options is None else self.options
        if not isinstance(options, Mapping):
            raise ValueError(f"merge options must map part names to their options, got {options!r}")
        unknown = [name for name in options if name not in names]
        if unknown:
            raise ValueError(f"merge options name {unknown!r}, which are not among the parts {names!r}")
        for name, part_options in options.items():
            if not isinstance(part_options, Mapping):
                raise ValueError(f"merge options for {name!r} must be a mapping, got {part_options!r}")
        self.options = {name: dict(part_options) for name, part_options in options.items()}
        if self.gamma is not None and (isinstance(self.gamma, bool) or not isinstance(self.gamma, int)
                                       or self.gamma < 1):
            raise ValueError(f"merge gamma must be an integer >= 1, got {self.gamma!r}")
        if self.min_tokens is not None and (isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int)
                                            or self.min_tokens < 1):
            raise ValueError(f"merge min_tokens must be an integer >= 1 or null, got {self.min_tokens!r}")
        if self.credit not in CREDITS:
            raise ValueError(f"merge credit must be one of {', '.join(CREDITS)}, got {self.credit!r}")
        _check_parts(names, self.options)


def _check_parts(names: list[str], options: dict[str, dict]) -> None:
    """Each named part registered and its options valid for its schema (the registry's own errors), before any
    model loads."""
    from specfamily.core.plugins import get_registry

    registry = get_registry()
    for name in names:
        registry.validate(name, **options.get(name, {}))
