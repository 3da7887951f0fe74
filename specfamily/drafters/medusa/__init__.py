"""medusa (and its variant hydra): heads on the target's last hidden state propose a token tree (Cai et al. 2024).

    drafter = sf.create_drafter("medusa", target)                    # zoo:code-medusa for the zoo target
    drafter = sf.create_drafter("medusa", target, weights="path/to/heads", tree="chain")

Train: ``python -m specfamily.drafters.medusa.train --help``. ``typical=True`` asks for Medusa's typical acceptance,
which is lossy: the drafter and every result are marked lossy, and the loop accepts with ``MedusaDrafter.accept``.

``hydra`` (Ankner et al. 2024) is registered from here too, as eagle3 is from eagle: heads that also read the
embeddings of the tokens drafted before them (``hydra_heads``); train with ``python -m
specfamily.drafters.medusa.hydra_train --help``.
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.medusa.config import MedusaConfig
from specfamily.drafters.medusa.hydra_config import HydraConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.medusa.drafter import MedusaDrafter
    from specfamily.drafters.medusa.hydra_drafter import HydraDrafter

    registry.register("medusa", MedusaDrafter, config=MedusaConfig,
                      description="Medusa-1 heads on the frozen target's last feature, token tree (Cai et al. 2024)")
    registry.register("hydra", HydraDrafter, config=HydraConfig,
                      description="Hydra heads: Medusa heads that read the tokens drafted before them (Ankner et al. "
                                  "2024), token tree")
