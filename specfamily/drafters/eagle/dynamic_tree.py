"""Re-export: the EAGLE-2 dynamic tree moved to :mod:`specfamily.drafters.shared.dynamic_tree` (shared with eagle3)."""

from specfamily.drafters.shared.dynamic_tree import (
    Candidates,
    DraftTree,
    StepFn,
    ancestor_closure,
    expand,
    grow_tree,
    most_confident,
    select_tree,
)

__all__ = ["Candidates", "DraftTree", "StepFn", "ancestor_closure", "expand", "grow_tree", "most_confident",
           "select_tree"]
