"""The lookahead branch: a window of W positions x up to N - 1 Jacobi levels, fed as side rows.

Level l, column j sits at depth l + j + 1 below the root and sees the level-0 tokens of columns 0..j and the tokens
of its own column in levels 1..l - 1 (its Jacobi trajectory): so level 0 is a causal run of guesses and each column
continues it one level further. The target's next token after the last level's column j is that column's new guess;
(level 0 .. last level, new guess) of a column is an n-gram for the pool. Pure functions on token lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specfamily.core.side_rows import SideRows


@dataclass
class JacobiWindow:
    """The current guesses, ``levels[l][j]``; warming up until it holds ``depth`` levels (N - 1)."""

    width: int  # W
    depth: int  # N - 1 levels when warm
    levels: list[list[int]] = field(default_factory=list)

    @property
    def warm(self) -> bool:
        return len(self.levels) == self.depth


def initial_guesses(context: list[int], width: int, generator: torch.Generator) -> list[int]:
    """Level 0 of a fresh window: ``width`` tokens drawn uniformly from the context (the reference's start)."""
    picks = torch.randint(0, len(context), (width,), generator=generator).tolist()
    return [context[i] for i in picks]


def window_rows(levels: list[list[int]]) -> SideRows:
    """The window as side rows, level by level (row l * W + j is level l, column j)."""
    width = len(levels[0])
    count = width * len(levels)
    visible = torch.zeros(count, count, dtype=torch.bool)
    depths = []
    for level in range(len(levels)):
        for column in range(width):
            row = level * width + column
            depths.append(level + column + 1)
            visible[row, : column + 1] = True  # level 0, columns 0..j
            visible[row, [above * width + column for above in range(1, level + 1)]] = True  # its own column
    tokens = [token for level in levels for token in level]
    return SideRows(torch.tensor(tokens, dtype=torch.long), torch.tensor(depths), visible)


def advance(window: JacobiWindow, side_logits: torch.Tensor) -> list[tuple[int, ...]]:
    """One Jacobi step from the target's logits at the window's rows (s, V): the new guesses become the last level
    (dropping level 0 once warm); returns the n-grams completed by this step (empty while warming up)."""
    width, levels = window.width, window.levels
    last = side_logits[(len(levels) - 1) * width : len(levels) * width]  # (W, V) the last level's rows
    new = last.argmax(dim=-1).tolist()
    grams: list[tuple[int, ...]] = []
    if window.warm:
        grams = [tuple(level[column] for level in levels) + (new[column],) for column in range(width)]
        window.levels = levels[1:]
    window.levels.append(new)
    return grams
