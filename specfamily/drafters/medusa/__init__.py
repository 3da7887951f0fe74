"""medusa: extra heads on the target's last hidden state propose a token tree (Medusa-1, Cai et al. 2024).

    drafter = sf.create_drafter("medusa", target)                    # zoo:code-medusa for the zoo target
    drafter = sf.create_drafter("medusa", target, weights="path/to/heads", tree="chain")

Train: ``python -m specfamily.drafters.medusa.train --help``. ``typical=True`` asks for Medusa's typical acceptance,
which is lossy: the drafter and every result are marked lossy, and the loop accepts with ``MedusaDrafter.accept``.
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.medusa.config import MedusaConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.medusa.drafter import MedusaDrafter

    registry.register("medusa", MedusaDrafter, config=MedusaConfig,
                      description="Medusa-1 heads on the frozen target's last feature, token tree (Cai et al. 2024)")
