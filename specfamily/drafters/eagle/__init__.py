"""eagle: the EAGLE family, one draft layer over the target's features, dynamic trees or chains; two registered
drafters.

- ``eagle`` (EAGLE-1/2; Li et al. 2024): one decoder layer over (target feature, next-token embedding), the
  target's LM head.
- ``eagle3`` (EAGLE-3; Li et al. 2025): fused low/middle/high target features, one decoder layer, its own LM head
  over a draft vocabulary (d2t/t2d); checkpoints in ours, the EAGLE/SpecForge and the speculators layouts.

Usage::

    drafter = sf.create_drafter("eagle", target)                      # zoo:code-eagle for the zoo target
    drafter = sf.create_drafter("eagle", target, weights="path/to/eagle", mode="chain", gamma=3)
    drafter = sf.create_drafter("eagle3", target, weights="random", mode="chain", gamma=3)

Train one for any target (frozen; features computed on the fly)::

    python -m specfamily.drafters.eagle.train --target zoo:code-target --out DIR \\
        --tokens work/zoo/train.npy --heldout work/zoo/heldout.npy --minutes 10 --threads 1
    python -m specfamily.drafters.eagle.train --variant eagle3 --target zoo:smollm2 --out DIR --distilled DIR

Modules: ``drafter`` (one drafter hierarchy: propose/observe, KV rollback; trees from
``specfamily.drafters.shared.dynamic_tree``), ``model`` / ``model3`` (the two networks), ``lean`` (their lean
forwards), ``config`` (options), ``checkpoint`` (where a drafter's model comes from; our EAGLE-1/2 format),
``formats`` / ``formats3`` (the EAGLE repository's and EAGLE-3's layouts), ``storage`` (what the readers share),
``data`` (training data), ``objective`` / ``ttt`` (the two objectives), ``training`` (the variants' parts of the
trainer), ``train_config`` and ``train`` (the trainer), ``calibrate`` (the tree shape for this machine).
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.eagle.config import Eagle3Config, EagleConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.eagle.drafter import Eagle3Drafter, EagleDrafter

    registry.register(
        "eagle",
        EagleDrafter,
        config=EagleConfig,
        description="one decoder layer over target features and next-token embeddings, dynamic tree (EAGLE-1/2)",
    )
    registry.register(
        "eagle3",
        Eagle3Drafter,
        config=Eagle3Config,
        description="EAGLE-3: fused low/middle/high target features, own head over a draft vocabulary, dynamic tree",
    )
