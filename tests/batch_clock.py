"""A fake clock for the batched loop's length-policy tests: every target pass costs what ``cost(B, rows)`` says."""

from __future__ import annotations

import torch

import specfamily as sf
from specfamily.core import batch_loop
from specfamily.core.arrivals import LoopClock
from specfamily.testing import tiny_target


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def price_passes(monkeypatch, clock: FakeClock, per_row: float = 0.01) -> None:
    """Every batched target pass advances ``clock`` by 1 + ``per_row`` a fed row (root, prompt or draft)."""
    forward = batch_loop.BatchTarget.forward

    def priced(self, lo, feeds, features=False):
        clock.t += 1.0 + per_row * sum(f.pending.numel() + len(f.draft) for f in feeds)
        return forward(self, lo, feeds, features)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", priced)


def priced_run(monkeypatch, cost, drafter_of, arrivals, passes=None, max_batch=None, max_new_tokens=60, target=None):
    """generate_batch on a fake clock where each target pass costs cost(B, N) (N: the rows fed); the greedy texts,
    and (B, each slot's draft length, steady) of every pass."""
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32) if target is None else target
    clock, seen = FakeClock(), [] if passes is None else passes
    forward = batch_loop.BatchTarget.forward

    def priced(self, lo, feeds, features=False):
        rows = sum(feed.pending.numel() + len(feed.draft) for feed in feeds)
        seen.append((len(feeds), [len(feed.draft) for feed in feeds], all(f.pending.numel() == 1 for f in feeds)))
        clock.t += cost(len(feeds), rows)
        return forward(self, lo, feeds, features)

    monkeypatch.setattr(batch_loop.BatchTarget, "forward", priced)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 64, (3 + i,), generator=gen).tolist() for i in range(len(arrivals))]
    results = sf.generate_batch(target, drafter_of(target), prompts, max_new_tokens=max_new_tokens, arrivals=arrivals,
                                clock=LoopClock(clock.now, clock.sleep), max_batch=max_batch)
    greedy = [sf.generate(target, None, p, max_new_tokens=max_new_tokens).tokens for p in prompts]
    assert [r.tokens for r in results] == greedy
    return results, seen
