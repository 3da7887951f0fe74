"""Train an EAGLE-3 drafter for a frozen target: ``python -m specfamily.drafters.eagle3.train --target T --out DIR``.

Training-time test (:mod:`specfamily.drafters.eagle3.ttt`): the draft unrolled ``--ttt-length`` steps (default 7)
over its own outputs, soft-label cross-entropy against the target's distribution at every step, step weights
0.8^s, no feature regression. Features (three target layers, ``--layers`` or the reference's) and the target's
logits come online from the frozen target; data is a token array (``--tokens``), an HF dataset (``--dataset``) or
self-distillation conversations (``--distilled``; their stored last-layer features are not used). ``--draft-vocab
N`` drafts over the N most frequent training tokens (d2t/t2d as the reference writes them). Every ``--eval-every``
steps the per-step top-1 accuracies on held-out windows give the simulated acceptance length (1 + sum of their
running products); the best one is exported to ``--out`` in the EAGLE/SpecForge layout (``--layout speculators``
for vLLM's), which ``sf.create_drafter("eagle3", target, weights=DIR)`` loads. Training state goes to ``--ckpt``
(default ``<out>.train.pt``, read with ``weights_only=True``) and a rerun resumes from it.

Under ``torchrun`` every rank trains a DistributedDataParallel replica on its share of each global batch
(``--batch`` rows per rank): ``torchrun --nproc-per-node 2 -m specfamily.drafters.eagle3.train ...`` (gloo on
CPU; ``--device cuda`` uses NCCL and GPU LOCAL_RANK). Rank 0 evaluates and writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specfamily.drafters.eagle3.formats import LAYOUTS
from specfamily.drafters.eagle3.ttt import DEFAULT_DECAY, DEFAULT_TTT_LENGTH
from specfamily.train import state as train_state
from specfamily.train.precision import device_arg, dtype_arg


@dataclass
class TrainConfig:
    target: str  # a folder, a hub name or a zoo: name
    out: str  # the exported drafter folder (best simulated acceptance length)
    ckpt: str = ""  # resumable training state; default <out>.train.pt
    tokens: str = ""  # a .npy token array (read only)
    heldout: str = ""  # a .npy held-out token array; default: the last heldout_fraction of the training data
    dataset: str = ""  # a datasets name or builder (json, text, parquet) or a local folder
    distilled: str = ""  # self-distillation conversations (`specfamily-zoo distill`); features recomputed online
    data_files: str = ""  # comma-separated files for the dataset builder
    split: str = "train"
    text_field: str = "text"
    max_documents: int = 0  # 0 = all
    heldout_fraction: float = 0.02
    draft_vocab: int = 0  # > 0: draft over the N most frequent training tokens (EOS always in); 0: full vocabulary
    layers: str = ""  # comma-separated target feature layers (hidden_states indexing); "": the reference's
    layout: str = "eagle"  # exported layout: eagle (EAGLE/SpecForge, SGLang) or speculators (vLLM)
    base_model: str = ""  # the verifier's hub name a speculators export records; "": the target's own name or path
    ttt_length: int = DEFAULT_TTT_LENGTH
    decay: float = DEFAULT_DECAY  # step s weighs decay ** s
    steps: int = 100000
    minutes: float = 10.0  # wall-clock budget (evaluations included); 0 = steps only
    batch: int = 4  # windows per rank and step
    seq_len: int = 256
    lr: float = 1e-4  # the reference's
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.0
    clip: float = 0.5
    eval_every: int = 60
    eval_windows: int = 16
    ckpt_every: int = 60
    seed: int = 0
    save_dtype: str = "float16"  # dtype of the exported weights
    threads: int = 0  # torch threads; 0 = leave as is
    device: str = "cpu"  # cpu, cuda or cuda:N (under torchrun: cuda, each rank on GPU LOCAL_RANK)
    dtype: str = "float32"  # float32, or bfloat16 / float16: autocast over float32 master weights

    def __post_init__(self) -> None:
        train_state.check_common(self)
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.save_dtype not in ("float16", "float32", "bfloat16"):
            raise ValueError(f"save_dtype must be float16, float32 or bfloat16, got {self.save_dtype!r}")
        if self.ttt_length < 1:
            raise ValueError(f"ttt_length must be >= 1, got {self.ttt_length}")
        if self.steps < 1 or self.batch < 1:
            raise ValueError("steps and batch must be >= 1")
        if self.seq_len < self.ttt_length + 2:
            raise ValueError(f"seq_len {self.seq_len} is too short for {self.ttt_length} unrolled steps "
                             f"(need >= {self.ttt_length + 2})")
        self.feature_layers  # noqa: B018 -- checks the layer list

    @property
    def ckpt_path(self) -> Path:
        return Path(self.ckpt) if self.ckpt else Path(f"{self.out.rstrip('/')}.train.pt")

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        if not self.layers:
            return None
        try:
            return tuple(int(part) for part in self.layers.split(","))
        except ValueError:
            raise ValueError(f"layers must be comma-separated integers, got {self.layers!r}") from None


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Command-line flags from the TrainConfig fields (``--ttt-length 7``)."""
    return train_state.parse_config(TrainConfig, "python -m specfamily.drafters.eagle3.train", __doc__, argv,
                                    {"device": device_arg, "dtype": dtype_arg})


def main(argv: list[str] | None = None) -> None:
    from specfamily.drafters.eagle3.loop import train

    state = train(parse_args(argv))
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"done: {state.step} steps, best simulated acceptance {state.best_acceptance:.3f} at step "
              f"{state.best_step}")


if __name__ == "__main__":
    main()
