"""EAGLE-3 training data: token streams (``--tokens``, ``--dataset``) or self-distillation conversations
(``--distilled``, the target's own greedy answers, as the eagle and medusa trainers read them).

EAGLE-3 fuses three target layers; the distillation files store only the last one (after the final norm), so their
stored features are dropped here and every batch's layer features and logits come online from the frozen target.
The sources, held-out split and draft-vocabulary counts are the eagle trainer's (:mod:`specfamily.drafters.eagle.data`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace

import numpy as np
import torch

from specfamily.core.target import Target
from specfamily.drafters.eagle.data import load_data as load_eagle_data


@dataclass
class Eagle3Data:
    train: object  # (batch, generator) -> tokens (batch, seq_len) long
    heldout: torch.Tensor  # fixed evaluation windows (n, seq_len)
    counted: np.ndarray | torch.Tensor  # the tokens the draft vocabulary's frequencies are counted on

    def sample(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        return self.train(batch, generator)[0]


def load_data(cfg, target: Target) -> Eagle3Data:
    """Training windows, held-out windows and the counted tokens of the configured source."""
    data = load_eagle_data(SimpleNamespace(**asdict(cfg), tau_prompts=0, tau_prompt_len=2), target)  # no prompts
    return Eagle3Data(data.sample, data.heldout[0], data.counted)
