"""Greedy decoding of prompts through the shared loop, measured as tau (new tokens / target passes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specfamily.core.loop import generate


def greedy_run(target, drafter, prompts: Sequence, new_tokens: int,
               clock: Callable[[], float] | None = None) -> tuple[list[list[int]], float, float]:
    """Each prompt's new tokens, tau over all prompts, and the seconds ``clock`` measured (0.0 without one)."""
    outputs, tokens, passes, started = [], 0, 0, clock() if clock else 0.0
    for prompt in prompts:
        result = generate(target, drafter, prompt, max_new_tokens=new_tokens)
        outputs.append(result.tokens)
        tokens, passes = tokens + result.metrics.new_tokens, passes + result.metrics.target_passes
    return outputs, tokens / max(passes, 1), clock() - started if clock else 0.0


def greedy_tau(target, drafter, prompts: Sequence, new_tokens: int) -> float:
    """tau of ``drafter`` over ``prompts``, greedy (``drafter=None``: plain decoding, tau = 1)."""
    return greedy_run(target, drafter, prompts, new_tokens)[1]
