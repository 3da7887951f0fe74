"""eagle: the EAGLE family, one draft layer over the target's features, dynamic trees or chains; two registered
drafters.

- ``eagle`` (EAGLE-1/2; Li et al. 2024): one decoder layer over (target feature, next-token embedding), the
  target's LM head.
- ``eagle3`` (EAGLE-3; Li et al. 2025): fused low/middle/high target features, one decoder layer, its own LM head
  over a draft vocabulary (d2t/t2d); checkpoints in ours, the EAGLE/SpecForge and the speculators layouts.

Usage::

    drafter = sf.create_drafter("eagle", target)                      # zoo:code-eagle for the zoo target
    drafter = sf.create_drafter("eagle3", target, weights="random", mode="chain", gamma=3)

Training: :mod:`specfamily.drafters.eagle.train`.
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.eagle.config import Eagle3Config, EagleConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.eagle.drafter import Eagle3Drafter, EagleDrafter

    registry.register("eagle", EagleDrafter, config=EagleConfig,
                      description="one decoder layer over target features and next-token embeddings, dynamic tree "
                                  "(EAGLE-1/2)")
    registry.register("eagle3", Eagle3Drafter, config=Eagle3Config,
                      description="EAGLE-3: fused low/middle/high target features, own head over a draft vocabulary, "
                                  "dynamic tree")
