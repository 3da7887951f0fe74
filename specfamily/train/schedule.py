"""The learning-rate schedule every trainer here uses: linear warm-up, then cosine decay to a floor, driven by
progress through a budget of steps or of wall-clock minutes, whichever runs out first."""

from __future__ import annotations

import math


def budget_progress(step: int, steps: int, seconds: float = 0.0, minutes: float = 0.0, warmup: int = 0) -> float:
    """Fraction of the budget spent after warm-up: the larger of the step and time fractions (minutes 0: steps)."""
    by_steps = (step - warmup) / max(1, steps - warmup)
    by_time = seconds / (minutes * 60) if minutes > 0 else 0.0
    return max(by_steps, by_time, 0.0)


def warmup_cosine(lr: float, step: int, warmup: int, progress: float, min_lr_ratio: float = 0.1) -> float:
    """``lr * (step + 1) / warmup`` during warm-up, then cosine from ``lr`` to ``min_lr_ratio * lr`` as
    ``progress`` goes 0 -> 1 (held at the floor after)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    floor = lr * min_lr_ratio
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * min(progress, 1.0)))
