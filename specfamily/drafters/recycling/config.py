"""Options of the recycling drafter (Token Recycling: Luo et al., 2024), with the reference's defaults."""

from __future__ import annotations

from dataclasses import dataclass

TEMPLATES = ("2.2.2",)  # as template.TEMPLATES (kept import-free here)
SCORED = "scored"  # no static template: the most likely nodes by the recycled probabilities (scored.grow_scored)
SCORED_DEPTH = 6  # its depth cap without a gamma (the reference template's depth)
SCORED_SIZE = 80  # its node cap without a max_tree_size (the reference template's size)


def _check_int(value: object, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class RecyclingConfig:
    """An adjacency table token -> its top_k most likely successors, rewritten from the logits of every pass
    (each fed token's row: the root and every drafted node), and a draft tree grown from it by a static template.

    ``top_k`` (reference: 8): successors kept per token; a template's ranks must be below it. ``template``:
    ``scored`` (default) grows the ``max_tree_size`` nodes with the highest path probability, the product of the
    recycled probabilities along the path, keeping only those >= ``threshold`` (so an unsure table drafts little or
    nothing, and a pass feeds few rows: on a CPU every row costs); ``2.2.2`` is the reference's static tree (80 nodes,
    depth 6, ranks < 8), of which ``max_tree_size`` keeps the first nodes by depth + summed rank (a parent always
    comes first; null: the whole template). ``threshold`` applies to ``scored`` only.
    ``gamma``: the depth cap (null: cost-aware, see policy). ``keep``: keep the table across requests (the reference
    does: it is one matrix for the whole run; in a batch every slot's requests learn into it) or start each request
    empty.
    """

    gamma: int | None = None  # depth cap of the tree; null: cost-aware (see policy)
    policy: str | None = None  # None: auto (cost-aware) without a gamma, constant with one | heuristic | optimal
    top_k: int = 8
    template: str = "scored"
    max_tree_size: int | None = 8
    keep: bool = True
    threshold: float = 0.35

    def __post_init__(self) -> None:
        if self.gamma is not None:
            _check_int(self.gamma, "gamma", 1)
        if self.policy is not None and not isinstance(self.policy, str):
            raise ValueError(f"policy must be a string, got {self.policy!r}")
        _check_int(self.top_k, "top_k", 1)
        if self.template not in (*TEMPLATES, SCORED):
            raise ValueError(f"template must be one of {', '.join((*TEMPLATES, SCORED))}, got {self.template!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float) \
                or not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be a number in [0, 1), got {self.threshold!r}")
        if self.max_tree_size is not None:
            _check_int(self.max_tree_size, "max_tree_size", 1)
        if not isinstance(self.keep, bool):
            raise ValueError(f"keep must be true or false, got {self.keep!r}")
