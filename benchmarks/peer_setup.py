"""What the peer benchmark's rows share: the target, draft, prompts, transformers' reference output and the clock
(``Setup``), and how it is built. ``peer.py`` and ``peer_rows.py`` build their rows on it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import common
from common import OursFactory, OursFn


@dataclass
class Setup:
    """Everything the rows share."""

    target: object
    draft: object
    prompts: list[list[int]]
    reference: list[list[int]]  # transformers' plain greedy output per prompt
    max_new_tokens: int
    clock: object
    args: argparse.Namespace

    def hf(self, **kwargs):
        """transformers generate on the target with ``kwargs`` as a benchmark callable."""
        model, n = self.target.model, self.max_new_tokens
        return lambda prompt: common.hf_generate(model, prompt, n, **kwargs)

    def ours(self, make: Callable[[], object]) -> OursFactory:
        """Our side with a new drafter object from ``make()`` each time the row is (re)built (``pairs``)."""
        return common.ours_factory(self.target, make, self.max_new_tokens)

    def plain(self) -> OursFn:
        """Our plain decoding, timed beside a drafter row."""
        return common.ours_fn(self.target, None, self.max_new_tokens)


def prepare(args: argparse.Namespace) -> Setup:
    """Fix the threads, load the pair and the prompts, compute the reference."""
    from specfamily.zoo import prompt_set_path

    common.set_threads(args.threads)
    common.quiet_transformers()
    draft = None if args.draft.lower() == "none" else args.draft
    target, draft = common.load_pair(args.target, draft, args.device, args.dtype, args.matmul)
    if args.prompts == "spec_bench":  # --count questions per category, first turns
        prompts, _ = common.spec_bench_prompts(args.count, target.tokenizer)
    else:
        prompts = common.load_prompts(args.prompts or prompt_set_path("continue"), args.count, target.tokenizer)
    return make_setup(target, draft, prompts, args)


def make_setup(target, draft, prompts: list[list[int]], args: argparse.Namespace) -> Setup:
    """A Setup over built models; the reference is transformers' plain greedy output."""
    reference = [common.hf_generate(target.model, p, args.tokens) for p in prompts]
    clock = common.make_clock(args.clock, str(target.device))
    return Setup(target, draft, prompts, reference, args.tokens, clock, args)
