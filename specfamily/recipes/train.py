"""Train a zoo model (target from the corpus, draft distilled from the target), resumable:
``specfamily-zoo train kind=draft workdir=WORK out=DIR teacher=TARGET ...``.

Configured like runs: ``configs/train/draft.yaml`` holds every key and its default, ``key=value`` overrides them
(``--flag value`` works too). The loop, checkpoint (``WORK/ckpt-<out's name>.pt``), ``device``, ``dtype`` and
``torchrun`` handling are :mod:`specfamily.train.loop`'s; the final weights are exported.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specfamily.io.files import write_folder_atomically
from specfamily.recipes.greedy_data import load_greedy_data, sample_rows
from specfamily.recipes.models import llama_config
from specfamily.train import loop
from specfamily.train.ddp import Objective, Ranks
from specfamily.train.loop import Evaluation, LoopSettings, Resumable, Step, Trainee
from specfamily.train.precision import Precision, check_device, check_dtype
from specfamily.train.tokens import fixed_windows, random_windows


@dataclass
class TrainConfig:
    kind: str  # "target", "draft" or "tiny"
    workdir: str  # holds tokenizer.json, train.npy, heldout.npy and the checkpoint
    out: str  # the exported HF folder
    steps: int = 2000
    batch: int = 8
    seq_len: int = 512
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    clip: float = 1.0
    minutes: float = 0.0  # 0 = no budget of step time; else the schedule ends at whichever comes first
    teacher: str = ""  # HF folder: distil from its distributions (KL) instead of the corpus labels
    init_from: str = ""  # HF folder: warm restart from these weights with a fresh optimiser
    greedy_data: str = ""  # .npy of windows continued by the target's greedy decoding (`specfamily-zoo greedy-data`)
    greedy_fraction: float = 0.5  # share of each batch's rows drawn from greedy_data when given
    eval_every: int = 100
    eval_windows: int = 32
    ckpt_every: int = 100
    resume: bool = True  # continue from the checkpoint when it exists
    seed: int = 0
    compile: bool = False  # torch.compile the loss
    device: str = "auto"  # auto (a GPU when there is one), cpu, cuda or cuda:N
    dtype: str = "auto"  # auto (bfloat16 on a GPU, else float32), float32, bfloat16 or float16: autocast


@dataclass
class TrainState:
    step: int = 0
    tokens_seen: int = 0
    seconds: float = 0.0
    heldout_loss: float = float("nan")


def check_config(cfg: TrainConfig) -> None:
    check_device(cfg.device)
    check_dtype(cfg.dtype)
    if not 0.0 <= cfg.greedy_fraction <= 1.0:
        raise ValueError(f"greedy_fraction must be in [0, 1], got {cfg.greedy_fraction}")
    if cfg.greedy_data and round(cfg.batch * cfg.greedy_fraction) == 0:
        raise ValueError(f"greedy_fraction {cfg.greedy_fraction} of a batch of {cfg.batch} draws no greedy rows")


def _loss(model, batch: torch.Tensor, teacher) -> torch.Tensor:
    inputs, labels = batch[:, :-1], batch[:, 1:]
    logits = model(input_ids=inputs).logits.float()
    if teacher is None:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    with torch.no_grad():
        log_p = F.log_softmax(teacher(input_ids=inputs).logits.float(), dim=-1)
    log_q = F.log_softmax(logits, dim=-1)
    return F.kl_div(log_q.flatten(0, 1), log_p.flatten(0, 1), log_target=True, reduction="batchmean")


def batch_loss(loss_fn, model, teacher, batches: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """The loss over non-empty batches of different lengths, each weighted by its predicted positions."""
    sizes = [b[:, 1:].numel() for b in batches]
    total = sum(sizes)
    return sum(loss_fn(model, b, teacher) * (size / total) for b, size in zip(batches, sizes, strict=True)), total


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) on fixed held-out windows."""
    model.eval()
    total, count = 0.0, 0
    for chunk in windows.split(batch):
        chunk = chunk.to(model.device)
        logits = model(input_ids=chunk[:, :-1]).logits.float()
        labels = chunk[:, 1:]
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum").item()
        count += labels.numel()
    model.train()
    return total / count


def export(model, tokenizer: PreTrainedTokenizerFast, out: Path, info: dict) -> None:
    """Write an fp16 HF folder atomically (a temp folder renamed into place)."""
    half = LlamaForCausalLM(model.config)
    half.load_state_dict(model.state_dict())

    def fill(tmp: Path) -> None:
        half.half().save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "training.json").write_text(json.dumps(info, indent=2) + "\n")

    write_folder_atomically(out, fill)


def train(cfg: TrainConfig) -> TrainState:
    """Train (or resume) the model ``cfg`` describes, then export it to ``cfg.out``; the final state."""
    check_config(cfg)
    return loop.train(ZooTraining(cfg))


class ZooTraining(Resumable):
    """A zoo model as a :class:`specfamily.train.loop.Family`: no selection (held-out loss is logged, the final
    weights are exported), step time alone counts against ``minutes``; no generator is saved (each step draws from
    its own seed)."""

    # what a resumed run must share with its checkpoint (steps and minutes may grow)
    fixed_options = ("kind", "teacher", "init_from", "greedy_data", "greedy_fraction", "batch", "seq_len", "seed")
    hint = "use another --out for a different run"

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.settings = LoopSettings.of(cfg, f"train {cfg.kind}", Path(cfg.workdir) / f"ckpt-{Path(cfg.out).name}.pt",
                                        timed_evaluations=False)

    def build(self, ranks: Ranks, precision: Precision) -> Trainee[TrainState]:
        cfg, work, self.device = self.cfg, Path(self.cfg.workdir), precision.device
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(str(work / "tokenizer"))
        self.tokens = np.load(work / "train.npy", mmap_mode="r")
        self.greedy = load_greedy_data(cfg.greedy_data, len(self.tokenizer)) if cfg.greedy_data else None
        self.windows = fixed_windows(np.load(work / "heldout.npy"), cfg.eval_windows, cfg.seq_len)
        if cfg.init_from:
            model = LlamaForCausalLM.from_pretrained(cfg.init_from, dtype=torch.float32, use_kernels=False)
        else:
            torch.manual_seed(cfg.seed)
            model = LlamaForCausalLM(llama_config(cfg.kind, len(self.tokenizer)))
        model = model.to(precision.device).train()
        teacher = None
        if cfg.teacher:
            teacher = LlamaForCausalLM.from_pretrained(cfg.teacher, dtype=torch.float32, use_kernels=False).eval()
        teacher = teacher.to(precision.device) if teacher is not None else None
        loss_fn = torch.compile(_loss) if cfg.compile else _loss
        objective = Objective(model, lambda m, rows: batch_loss(loss_fn, m, teacher, rows))
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
        return Trainee(model, optimizer, objective, TrainState(), precision.scaler())

    def step(self, trainee: Trainee[TrainState], ranks: Ranks) -> Step:
        state, cfg = trainee.state, self.cfg  # the step's global batch (``batch`` rows per rank), drawn alike by all
        batch = cfg.batch * ranks.world_size
        generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + state.step)
        drawn = 0 if self.greedy is None else round(batch * cfg.greedy_fraction)  # rows from the greedy windows
        rows = [random_windows(self.tokens, batch - drawn, cfg.seq_len, generator)] if drawn < batch else []
        rows += [sample_rows(self.greedy, drawn, generator)] if drawn else []
        loss, positions = trainee.objective([ranks.local(b).to(self.device) for b in rows])
        state.tokens_seen += positions * ranks.world_size
        return Step(loss, {"loss": f"{loss.item():.3f}", "heldout": f"{state.heldout_loss:.3f}"})

    def evaluate(self, trainee: Trainee[TrainState]) -> Evaluation:
        state = trainee.state
        state.heldout_loss = heldout_loss(trainee.model, self.windows)
        return Evaluation(f"tokens {state.tokens_seen} heldout {state.heldout_loss:.4f}")

    def export(self, trainee: Trainee[TrainState], evaluation: Evaluation) -> None:
        """Never called: no evaluation has a score (the final weights are exported by :meth:`finish`)."""

    def finish(self, trainee: Trainee[TrainState]) -> None:
        model = trainee.model
        cfg, state = self.cfg, trainee.state
        earlier: list[dict] = []  # the runs it warm-started from (init_from's own training.json), earliest first
        previous = Path(cfg.init_from) / "training.json" if cfg.init_from else None
        if previous is not None and previous.is_file():
            saved = json.loads(previous.read_text())
            earlier = saved.get("earlier_runs", []) + [{"config": saved["config"], "state": saved["state"]}]
        total = state.tokens_seen + sum(run["state"]["tokens_seen"] for run in earlier)
        info = {"config": asdict(cfg), "state": asdict(state), "parameters": sum(p.numel() for p in model.parameters()),
                "earlier_runs": earlier, "tokens_seen_total": total}
        export(model, self.tokenizer, Path(cfg.out), info)
