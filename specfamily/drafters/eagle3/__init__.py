"""eagle3: EAGLE-3 (Li et al. 2025): fused low/middle/high target features, one decoder layer, its own LM head
over a draft vocabulary (d2t/t2d), EAGLE-2 dynamic trees or chains.

Usage::

    drafter = sf.create_drafter("eagle3", target, weights="path/to/checkpoint")   # ours, EAGLE/SpecForge, speculators
    drafter = sf.create_drafter("eagle3", target, weights="random", mode="chain", gamma=3)

Modules: ``model`` (the network, reference module names), ``drafter`` (propose/observe, KV rollback; trees from
``specfamily.drafters.shared.dynamic_tree``), ``formats`` (checkpoints in the EAGLE/SpecForge and speculators
layouts, read and written), ``config``.
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.eagle3.config import Eagle3Config


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.eagle3.drafter import Eagle3Drafter

    registry.register(
        "eagle3",
        Eagle3Drafter,
        config=Eagle3Config,
        description="EAGLE-3: fused low/middle/high target features, own head over a draft vocabulary, dynamic tree",
    )
