"""eagle: one decoder layer over (target feature, next-token embedding), dynamic tree (EAGLE-1/2; Li et al. 2024).

Usage::

    drafter = sf.create_drafter("eagle", target)                      # zoo:code-eagle for the zoo target
    drafter = sf.create_drafter("eagle", target, weights="path/to/eagle", mode="chain", gamma=3)

Train one for any target (frozen; features computed on the fly)::

    python -m specfamily.drafters.eagle.train --target zoo:code-target --out DIR \\
        --tokens work/zoo/train.npy --heldout work/zoo/heldout.npy --minutes 10 --threads 1

Modules: ``model`` (the network), ``drafter`` (propose/observe, KV rollback; EAGLE-2 tree growth and reranking
is ``specfamily.drafters.shared.dynamic_tree``, shared with eagle3), ``objective`` and ``train`` (training),
``calibrate`` (the tree shape for this machine), ``checkpoint``, ``config``.
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.eagle.config import EagleConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.eagle.drafter import EagleDrafter

    registry.register(
        "eagle",
        EagleDrafter,
        config=EagleConfig,
        description="one decoder layer over target features and next-token embeddings, dynamic tree (EAGLE-1/2)",
    )
