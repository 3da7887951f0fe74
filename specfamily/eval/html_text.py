"""The HTML view's texts: every prompt, and each drafter's answer coloured by where each token came from.

A token's origin comes from the record's pass trace (:func:`specfamily.core.trace.token_origins`): accepted at depth
d, the bonus token, or the target's own token; its text from the record's ``pieces``
(:mod:`specfamily.eval.pieces`). A record without them (``trace: false``, no tokenizer, an older run) is shown as
plain text and says so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from html import escape

from specfamily.core.trace import BONUS, TARGET, Trace, token_origins
from specfamily.eval.results import PromptRecord

MAX_SHADE = 8  # depths past this share the deepest colour


def origin_class(origin: int) -> str:
    """The CSS class of an origin: ``o-t`` (target), ``o-b`` (bonus), ``o-d1`` ... ``o-d8`` (accepted at depth d)."""
    if origin == TARGET:
        return "o-t"
    if origin == BONUS:
        return "o-b"
    return f"o-d{min(origin, MAX_SHADE)}"


def origin_title(origin: int) -> str:
    if origin == TARGET:
        return "target"
    if origin == BONUS:
        return "bonus"
    return f"accepted at depth {origin}"


def record_origins(record: PromptRecord) -> list[int] | None:
    """The origin of each of the record's tokens, or None when the record has no trace."""
    if record.trace is None:
        return None
    origins = token_origins(Trace.from_dict(record.trace))
    return origins if len(origins) == len(record.tokens) else None


def coloured_text(record: PromptRecord) -> str:
    """The record's answer as spans, one per token (escaped), or its plain text when it cannot be coloured."""
    origins = record_origins(record)
    if origins is None or record.pieces is None or len(record.pieces) != len(origins):
        text = escape(record.text if record.text is not None else " ".join(map(str, record.tokens)))
        return f'<span class="o-none" title="no pass trace recorded">{text}</span>'
    return "".join(f'<span class="{origin_class(o)}" title="{origin_title(o)}">{escape(piece)}</span>'
                   for o, piece in zip(origins, record.pieces, strict=True))


@dataclass
class OriginCounts:
    """How one drafter's tokens came about, over its records with a trace."""

    drafter: str
    counts: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def share(self, origin: int) -> float:
        return self.counts[origin] / self.total if self.total else float("nan")


def origin_counts(records: list[PromptRecord]) -> list[OriginCounts]:
    """Per drafter (in order of appearance), the count of tokens of each origin."""
    found: dict[str, OriginCounts] = {}
    for record in records:
        origins = record_origins(record)
        if origins is not None:
            found.setdefault(record.drafter, OriginCounts(record.drafter)).counts.update(origins)
    return list(found.values())


def _attr(value: str | None) -> str:
    return escape(value or "", quote=True)


def text_block(record: PromptRecord, run: str | None) -> str:
    """One drafter's answer to one prompt turn."""
    label = escape(record.drafter + (f" [{run}]" if run else ""))
    return (f'<div class="text" data-drafter="{_attr(record.drafter)}" data-category="{_attr(record.category)}">'
            f'<div class="who">{label} <small>{len(record.tokens)} tokens, tau '
            f'{_tau(record)}</small></div><pre>{coloured_text(record)}</pre></div>')


def _tau(record: PromptRecord) -> str:
    tau = record.metrics.get("mean_accepted_length")
    return "-" if tau is None else f"{tau:.2f}"


def prompt_sections(records: list[tuple[str | None, PromptRecord]]) -> str:
    """Every prompt turn (in the records' order), its text and each drafter's answer under it."""
    groups: dict[tuple[str | None, str], list[PromptRecord]] = {}
    for run, record in records:
        groups.setdefault((run, record.prompt_id), []).append(record)
    parts = []
    for (run, prompt_id), mine in groups.items():
        first = mine[0]
        category = f" · {escape(first.category)}" if first.category else ""
        where = f" · run {escape(run)}" if run else ""
        prompt = escape(first.prompt) if first.prompt is not None else "(prompt text not recorded)"
        parts.append(f'<section class="prompt" data-category="{_attr(first.category)}">'
                     f'<h3>{escape(prompt_id)}{category}{where}</h3>'
                     f'<details><summary>prompt</summary><pre class="prompt-text">{prompt}</pre></details>'
                     + "".join(text_block(r, run) for r in mine) + "</section>")
    return "\n".join(parts)
