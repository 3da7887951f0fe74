"""The default size of an EAGLE tree, from what a verify pass costs on the device in use.

A tree of n nodes is verified in one target pass over 1 + n tokens. On a CPU that pass grows quickly with n (about
1.3 plain passes at 4 tokens and 2.1 at 12 on the project's machine, docs/pass-cost.md), so the best tree is small;
on a GPU it is flat (1.05 at 64 tokens on an H200, docs/gpu-h200.md), so EAGLE-2's 60-node tree is free to verify.
The default is the largest rung of :data:`TREE_SHAPES` whose pass costs at most :data:`TREE_COST_CAP` plain
passes on the measured curve (the cost-aware policy's, ``specfamily.core.costs``, measured once per target); the
smallest rung when none fits. A checkpoint's calibrated shape, or options given, take precedence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specfamily.core.costs import target_cost_curve
from specfamily.core.target import Target


@dataclass(frozen=True)
class TreeShape:
    total_tokens: int  # nodes kept after reranking
    top_k: int  # children per expanded node and nodes expanded per depth
    depth: int  # the tree mode's default gamma


TREE_SHAPES = (TreeShape(12, 4, 5), TreeShape(24, 6, 6), TreeShape(40, 8, 6), TreeShape(60, 10, 7))  # the last:
# EAGLE-2's GPU default (60 nodes, top-k 10, depth 7)
TREE_COST_CAP = 1.5  # a tree's verify pass may cost this many plain passes


def tree_shape_for(cost: Callable[[float], float]) -> TreeShape:
    """The largest shape whose verify pass (t(1 + n) / t(1) = ``cost(n)``) is within the cap; else the smallest."""
    fitting = [shape for shape in TREE_SHAPES if cost(shape.total_tokens) <= TREE_COST_CAP]
    return fitting[-1] if fitting else TREE_SHAPES[0]


def default_tree_shape(target: Target) -> TreeShape:
    """The tree shape for ``target`` on its device. On the CPU (and a target laid out on ``meta``) the smallest rung
    without timing anything: the CPU curve is above the cap from a few tokens on, and measuring it would cost every
    drafter's creation a second."""
    if target.device.type in ("cpu", "meta"):
        return TREE_SHAPES[0]
    context = [i % target.vocab_size for i in range(1, 257)]
    return tree_shape_for(target_cost_curve(target, context))
