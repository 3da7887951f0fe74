"""medusa: extra heads on the target's last hidden state propose a token tree (Medusa-1, Cai et al. 2024).

    drafter = sf.create_drafter("medusa", target)                    # zoo:code-medusa for the zoo target
    drafter = sf.create_drafter("medusa", target, weights="random")  # fresh heads (tests, start of training)
    drafter = sf.create_drafter("medusa", target, weights="path/to/heads", tree="chain")

Train: ``python -m specfamily.drafters.medusa.train --help``; compare with plain decoding and transformers:
``python benchmarks/peer.py --only plain,medusa``. ``typical=True`` asks for Medusa's typical acceptance,
which is lossy: the drafter is marked lossy and so is every result, and the loop accepts with its rule
(``MedusaDrafter.accept``) in place of the exact verifier. At temperature 0 the rule is greedy matching.
"""

from __future__ import annotations

from specfamily.core.hookspecs import hookimpl
from specfamily.drafters.medusa.config import MedusaConfig


@hookimpl
def specfamily_register_drafters(registry) -> None:
    from specfamily.drafters.medusa.drafter import MedusaDrafter

    registry.register(
        "medusa",
        MedusaDrafter,
        config=MedusaConfig,
        description="Medusa-1 heads on the frozen target's last feature, token tree (Cai et al. 2024)",
    )
