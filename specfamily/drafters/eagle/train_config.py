"""Options of the EAGLE trainer, one dataclass per variant over the options both share: :class:`TrainConfig`
(``eagle``) and :class:`Eagle3TrainConfig` (``eagle3``), with keys and defaults in ``configs/train/eagle.yaml`` and
``eagle3.yaml`` (:mod:`specfamily.train.config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from specfamily.drafters.eagle.formats3 import LAYOUTS
from specfamily.drafters.eagle.ttt import DEFAULT_DECAY, DEFAULT_TTT_LENGTH
from specfamily.train.precision import check_device, check_dtype

SAVE_DTYPES = ("float16", "float32", "bfloat16")


@dataclass
class CommonTrainConfig:
    """What every EAGLE training run takes: target, data, schedule, evaluation cadence, device and export."""

    target: str  # a folder, a hub name or a zoo: name
    out: str  # the exported drafter folder (the best evaluation)
    ckpt: str = ""  # resumable training state; default <out>.train.pt
    tokens: str = ""  # a .npy token array (read only)
    heldout: str = ""  # a .npy held-out token array; default: the last heldout_fraction of the training data
    dataset: str = ""  # a datasets name or builder (json, text, parquet) or a local folder
    distilled: str = ""  # a folder of self-distillation data (`specfamily-zoo distill`)
    draft_vocab: int = 0  # > 0: draft over the N most frequent (answer) tokens of the training data (EOS always in)
    data_files: str = ""  # comma-separated files for the dataset builder
    split: str = "train"
    text_field: str = "text"
    max_documents: int = 0  # 0 = all
    heldout_fraction: float = 0.02
    steps: int = 100000
    minutes: float = 10.0  # wall-clock budget (evaluations included); 0 = steps only
    batch: int = 4  # windows per rank and step
    seq_len: int = 256
    lr: float = 1e-3
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
    resume: bool = True  # continue from the training state when it exists (off: it is overwritten)
    device: str = "auto"  # auto (a GPU if any), cpu, cuda, cuda:N (torchrun: cuda, each rank on GPU LOCAL_RANK)
    dtype: str = "auto"  # auto (bfloat16 on a GPU, else float32), float32, or bfloat16 / float16: autocast

    def __post_init__(self) -> None:
        check_device(self.device)
        check_dtype(self.dtype)
        if sum(map(bool, (self.tokens, self.dataset, self.distilled))) != 1:
            raise ValueError("give exactly one data source: --tokens FILE.npy, --dataset NAME or --distilled DIR")
        if self.draft_vocab < 0:
            raise ValueError(f"draft_vocab must be >= 0 (0 = the full vocabulary), got {self.draft_vocab}")
        if self.save_dtype not in SAVE_DTYPES:
            raise ValueError(f"save_dtype must be float16, float32 or bfloat16, got {self.save_dtype!r}")

    @property
    def ckpt_path(self) -> Path:
        return Path(self.ckpt) if self.ckpt else Path(f"{self.out.rstrip('/')}.train.pt")


@dataclass
class TrainConfig(CommonTrainConfig):
    """EAGLE-1/2: the best greedy tau on held-out prompts is exported (our format; ``--reference-form``: a head
    the EAGLE repository's layout can hold)."""

    reference_form: bool = False  # no input norm on the draft layer (EAGLE's layer 0): exports to the EAGLE layout
    noise: float = 0.2  # width of the uniform noise added to input features
    w_reg: float = 1.0
    w_cls: float = 0.1
    tau_prompts: int = 4
    tau_prompt_len: int = 128
    tau_tokens: int = 48

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 1 or self.batch < 1 or self.seq_len < 2:
            raise ValueError("steps and batch must be >= 1 and seq_len >= 2")


@dataclass
class Eagle3TrainConfig(CommonTrainConfig):
    """EAGLE-3: the best simulated acceptance length on held-out windows is exported (``layout``: eagle or
    speculators). Stored distillation features are not used: the three layers' features come online."""

    lr: float = 1e-4  # the reference's
    layers: str = ""  # comma-separated target feature layers (hidden_states indexing); "": the reference's
    layout: str = "eagle"  # exported layout: eagle (EAGLE/SpecForge, SGLang) or speculators (vLLM)
    base_model: str = ""  # the verifier's hub name a speculators export records; "": the target's own name or path
    ttt_length: int = DEFAULT_TTT_LENGTH
    decay: float = DEFAULT_DECAY  # step s weighs decay ** s

    tau_prompts: ClassVar[int] = 0  # scored by simulated acceptance, not tau: the data needs no held-out prompts

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.ttt_length < 1:
            raise ValueError(f"ttt_length must be >= 1, got {self.ttt_length}")
        if self.steps < 1 or self.batch < 1:
            raise ValueError("steps and batch must be >= 1")
        if self.seq_len < self.ttt_length + 2:
            raise ValueError(f"seq_len {self.seq_len} is too short for {self.ttt_length} unrolled steps "
                             f"(need >= {self.ttt_length + 2})")
        self.feature_layers  # noqa: B018 -- checks the layer list

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        if not self.layers:
            return None
        try:
            return tuple(int(part) for part in self.layers.split(","))
        except ValueError:
            raise ValueError(f"layers must be comma-separated integers, got {self.layers!r}") from None
