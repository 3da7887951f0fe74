"""Greedy equivalence with transformers' ``generate``: token for token in float32/64, near-ties only in bf16.

In 16-bit floats a pass over n tokens rounds differently from a pass over one, so two candidates whose logits are
within an ulp can swap and a speculative decoder's greedy text may leave plain greedy at such a near-tie.
:func:`greedy_report` finds, per prompt, the first differing position and the reference's logit gap there; a flip is
a near-tie when the gap is within ``TIE_ULPS`` ulps of the 16-bit format, and :func:`assert_greedy_equivalent` in
bf16 fails on any other flip (measured flip rates: docs/conformance.md).

A greedy check proves only what it drafts, so the drafter runs wrapped in a :class:`DepthRecorder` at the constant
draft length ``gamma`` (:data:`GAMMA` unless given; ``gamma=None`` keeps the drafter's own policy), and
:func:`check_report` fails when it drafted nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from specfamily.core.loop import generate
from specfamily.testing.depth import DepthRecorder, DepthStats
from specfamily.testing.tiny import single_thread, tiny_target

TIE_ULPS = 2
GAMMA = 3  # the constant draft length (tree depth) greedy checks drive drafters at, as the conformance kit's GAMMA
EXACT_DTYPES = (torch.float32, torch.float64)


@dataclass
class Flip:
    """The first position where the drafter's greedy text left the reference's, for one prompt."""

    prompt: int
    position: int
    ours: int
    reference: int
    gap: float  # reference logit of its own token minus its logit of ours (>= 0: the reference took its argmax)
    tolerance: float  # TIE_ULPS ulps of the dtype at the larger of the two logits

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.tolerance


@dataclass
class GreedyReport:
    """Greedy text of a drafter against transformers' greedy ``generate`` over a set of prompts."""

    family: str
    dtype: torch.dtype
    prompts: int
    tokens: int  # tokens compared: each prompt's, up to and including its first flip
    flips: list[Flip] = field(default_factory=list)
    drafter: str = "plain"  # the drafter's class name; "plain" for plain decoding
    depth: DepthStats | None = None  # passes and positions verified by depth; None for plain decoding
    proposed_tokens: int = 0  # draft tokens (tree nodes) proposed over all prompts
    gamma: int | None = None  # the constant draft length it ran at; None: the drafter's own policy

    @property
    def drafted_passes(self) -> int:
        return 0 if self.depth is None else self.depth.passes

    @property
    def token_flip_rate(self) -> float:
        """Flips per compared token: the chance that a given greedy step leaves plain greedy."""
        return len(self.flips) / self.tokens if self.tokens else math.nan

    @property
    def not_near_ties(self) -> list[Flip]:
        return [flip for flip in self.flips if not flip.near_tie]

    def describe(self) -> str:
        gaps = ", ".join(f"{flip.gap:.2e}" for flip in self.flips) or "none"
        text = (f"{self.family} {self.dtype}: {len(self.flips)}/{self.prompts} prompts flipped "
                f"({self.token_flip_rate:.2%} of {self.tokens} tokens); logit gaps at the flips: {gaps}")
        if self.depth is None:
            return text
        length = "its own policy" if self.gamma is None else f"gamma {self.gamma}"
        return (f"{text}; {self.drafter} at {length}: {self.drafted_passes} drafted passes, "
                f"{self.proposed_tokens} draft tokens, positions verified by depth {self.depth.verified}")


def ulp(value: float, dtype: torch.dtype) -> float:
    """Spacing of ``dtype`` numbers at ``|value|``."""
    info = torch.finfo(dtype)
    magnitude = max(abs(value), info.tiny)
    return info.eps * 2.0 ** math.floor(math.log2(magnitude))


def greedy_prompts(vocab_size: int, prompts: int, seed: int = 0) -> list[torch.Tensor]:
    """Random prompts of 3 to 38 tokens (the first ones as the suite always had)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (3 + 5 * (i % 8),), generator=gen) for i in range(prompts)]


@torch.inference_mode()
def reference_greedy(model, prompt: torch.Tensor, max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the raw logits (T, V) it chose them from."""
    ids = prompt.view(1, -1).to(model.device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
    )
    return out.sequences[0, ids.shape[1] :].tolist(), torch.stack(out.logits)[:, 0].float().cpu()


@dataclass
class GreedyCase:
    """A target, prompts and transformers' greedy references for them, shared by the drafters compared."""

    family: str
    target: object
    prompts: list[torch.Tensor]
    references: list[tuple[list[int], torch.Tensor]]
    max_new_tokens: int


def greedy_case(family: str = "llama", dtype: torch.dtype = torch.bfloat16, vocab_size: int = 64,
                prompts: int = 50, max_new_tokens: int = 24, **model_options) -> GreedyCase:
    """A tiny target (``model_options``: :func:`tiny_model`'s ``hidden``, ``layers``, ...) and its references."""
    target = tiny_target(family, vocab_size=vocab_size, spread=1.0, dtype=dtype, **model_options)
    chosen = greedy_prompts(vocab_size, prompts)
    references = [reference_greedy(target.model, prompt, max_new_tokens) for prompt in chosen]
    return GreedyCase(family, target, chosen, references, max_new_tokens)


def _first_flip(index: int, ours: list[int], reference: list[int], logits: torch.Tensor, dtype) -> Flip | None:
    position = next((t for t, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b), None)
    if position is None:
        return None
    row = logits[position]
    mine, theirs = row[ours[position]].item(), row[reference[position]].item()
    tolerance = TIE_ULPS * ulp(max(abs(mine), abs(theirs)), dtype)
    return Flip(index, position, ours[position], reference[position], theirs - mine, tolerance)


def compare_greedy(case: GreedyCase, drafter, gamma: int | None = GAMMA) -> GreedyReport:
    """The drafter's greedy text on every prompt of ``case`` against the references, drafting at the constant
    length ``gamma`` (``None``: the drafter's own policy); the report counts what was drafted and verified."""
    dtype = case.target.dtype
    report = GreedyReport(case.family, dtype, len(case.prompts), 0)
    recorder = None
    if drafter is not None:
        recorder = DepthRecorder(drafter, gamma=gamma)
        report.drafter, report.depth, report.gamma = type(drafter).__name__, recorder.stats, gamma
    for index, (prompt, (reference, logits)) in enumerate(zip(case.prompts, case.references, strict=True)):
        result = generate(case.target, recorder, prompt, max_new_tokens=case.max_new_tokens)
        ours = result.tokens
        report.proposed_tokens += result.metrics.proposed_tokens
        if len(ours) != len(reference):
            raise AssertionError(f"{case.family} prompt {index}: {len(ours)} tokens, the reference has "
                                 f"{len(reference)}")
        flip = _first_flip(index, ours, reference, logits, dtype)
        report.tokens += case.max_new_tokens if flip is None else flip.position + 1
        if flip is not None:
            report.flips.append(flip)
    return report


def greedy_report(factory: Callable, *, family: str = "llama", dtype: torch.dtype = torch.bfloat16,
                  vocab_size: int = 64, prompts: int = 50, max_new_tokens: int = 24, gamma: int | None = GAMMA,
                  **model_options) -> GreedyReport:
    """Measure how often, and at what logit gaps, the drafter's greedy text leaves transformers' greedy text."""
    case = greedy_case(family, dtype, vocab_size, prompts, max_new_tokens, **model_options)
    return compare_greedy(case, factory(case.target), gamma=gamma)


def check_drafted(report: GreedyReport) -> None:
    """Raise when a drafter (not plain decoding) drafted nothing: its check compared plain decoding with itself."""
    if report.depth is None or (report.drafted_passes and report.proposed_tokens):
        return
    length = "its own policy" if report.gamma is None else f"a constant gamma {report.gamma}"
    raise AssertionError(
        f"{report.drafter} drafted nothing on the {report.family} target ({report.drafted_passes} drafted passes, "
        f"{report.proposed_tokens} draft tokens over {report.prompts} prompts at {length}): a greedy check that "
        f"drafts nothing only compares plain decoding with itself"
    )


def check_report(report: GreedyReport) -> None:
    """Raise unless the drafter drafted and the report is exact (float32/64) or every flip is a near-tie (16-bit)."""
    check_drafted(report)
    if report.dtype in EXACT_DTYPES and report.flips:
        flip = report.flips[0]
        raise AssertionError(f"{report.family} prompt {flip.prompt}: greedy tokens differ at position "
                             f"{flip.position} (ours {flip.ours}, reference {flip.reference}); {report.describe()}")
    bad = report.not_near_ties
    if bad:
        flip = bad[0]
        raise AssertionError(
            f"{report.family} prompt {flip.prompt}: greedy token {flip.ours} at position {flip.position} where the "
            f"reference took {flip.reference} by a logit gap of {flip.gap:.3e} > {flip.tolerance:.3e} "
            f"({TIE_ULPS} ulps of {report.dtype}): not a near-tie. {report.describe()}"
        )


def assert_greedy_equivalent(factory: Callable, *, families: Sequence[str] = ("llama", "gpt2"),
                             vocab_size: int = 64, prompts: int = 4, max_new_tokens: int = 24,
                             dtype: torch.dtype = torch.float64, gamma: int | None = GAMMA,
                             **model_options) -> list[GreedyReport]:
    """Fail unless the drafter drafted (at the constant length ``gamma``; ``None``: its own policy) and greedy
    generation with it equals transformers' greedy generate, token for token (float32/64), or leaves it only at
    near-ties (bf16/fp16; the reports say how often, and how many positions were verified at each depth)."""
    reports = []
    for family in families:
        with single_thread():
            report = greedy_report(factory, family=family, dtype=dtype, vocab_size=vocab_size, prompts=prompts,
                                   max_new_tokens=max_new_tokens, gamma=gamma, **model_options)
        check_report(report)
        reports.append(report)
    return reports
