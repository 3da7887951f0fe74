"""Train an EAGLE drafter for a frozen target: ``python -m specfamily.drafters.eagle.train --target T --out DIR``.

Features come from the target on the fly (nothing dumped to disk); data is a token array (``--tokens``, e.g. the
zoo corpus ``work/zoo/train.npy``) or any HF dataset (``--dataset json --data-files a.jsonl``). Every
``--eval-every`` steps: top-1 agreement with the target on held-out windows and greedy tau through the shared
verifier on held-out prompts; the drafter with the best tau is exported to ``--out`` (safetensors + config.json).
``--reference-form`` trains the draft layer without its input norm, as EAGLE's layer 0 has none, so that
``specfamily-zoo export --drafter eagle --layout eagle`` can write it in the EAGLE repository's layout.
Training state (weights, optimiser, data RNG, best weights) goes to ``--ckpt`` and a rerun resumes from it; the
state file is read as tensors and plain containers only (``torch.load(weights_only=True)``), so a state file from
elsewhere cannot run code. ``--device cuda`` trains on a GPU; ``--dtype bfloat16`` (or float16) runs the passes
under autocast with float32 master weights. Under ``torchrun`` each rank trains a DistributedDataParallel replica on
its share of every global batch (``--batch`` rows per rank; :mod:`specfamily.train.ddp`), rank 0 evaluates and writes.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from specfamily.core.target import Target, load_target
from specfamily.drafters.eagle.checkpoint import check_target, save_eagle
from specfamily.drafters.eagle.data import EagleData, load_data
from specfamily.drafters.eagle.model import EagleModel, build_model
from specfamily.drafters.eagle.objective import eagle_loss, feature_agreement, feature_loss, measure_tau, top1_agreement
from specfamily.drafters.shared.draft_vocab import target_draft_vocab
from specfamily.train import state as train_state
from specfamily.train.ddp import Objective, Ranks, start, unwrap
from specfamily.train.precision import Precision, device_arg, dtype_arg, optimizer_step
from specfamily.train.schedule import budget_progress, warmup_cosine


@dataclass
class TrainConfig:
    target: str  # a folder, a hub name or a zoo: name
    out: str  # the exported drafter folder (best tau)
    ckpt: str = ""  # resumable training state; default <out>.train.pt
    tokens: str = ""  # a .npy token array (read only)
    heldout: str = ""  # a .npy held-out token array; default: the last heldout_fraction of the training data
    dataset: str = ""  # a datasets name or builder (json, text, parquet) or a local folder
    distilled: str = ""  # a folder of self-distillation data with stored features (`specfamily-zoo distill`)
    draft_vocab: int = 0  # > 0: draft over the N most frequent (answer) tokens of the training data (FR-Spec)
    reference_form: bool = False  # no input norm on the draft layer (EAGLE's layer 0): exports to the EAGLE layout
    data_files: str = ""  # comma-separated files for the dataset builder
    split: str = "train"
    text_field: str = "text"
    max_documents: int = 0  # 0 = all
    heldout_fraction: float = 0.02
    steps: int = 100000
    minutes: float = 10.0  # wall-clock budget (evaluations included); 0 = steps only
    batch: int = 4
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.0
    clip: float = 0.5
    noise: float = 0.2  # width of the uniform noise added to input features
    w_reg: float = 1.0
    w_cls: float = 0.1
    eval_every: int = 60
    eval_windows: int = 16
    tau_prompts: int = 4
    tau_prompt_len: int = 128
    tau_tokens: int = 48
    ckpt_every: int = 60
    seed: int = 0
    save_dtype: str = "float16"  # dtype of the exported weights
    threads: int = 0  # torch threads; 0 = leave as is
    device: str = "cpu"  # cpu, cuda or cuda:N
    dtype: str = "float32"  # float32, or bfloat16 / float16: autocast over float32 master weights

    def __post_init__(self) -> None:
        train_state.check_common(self)
        if self.save_dtype not in ("float16", "float32", "bfloat16"):
            raise ValueError(f"save_dtype must be float16, float32 or bfloat16, got {self.save_dtype!r}")
        if self.steps < 1 or self.batch < 1 or self.seq_len < 2:
            raise ValueError("steps and batch must be >= 1 and seq_len >= 2")

    @property
    def ckpt_path(self) -> Path:
        return Path(self.ckpt) if self.ckpt else Path(f"{self.out.rstrip('/')}.train.pt")


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    tokens_seen: int = 0
    best_tau: float = float("-inf")
    best_step: int = -1
    last_agreement: float = float("nan")
    last_tau: float = float("nan")


def learning_rate(cfg: TrainConfig, step: int, progress: float) -> float:
    return warmup_cosine(cfg.lr, step, cfg.warmup, progress, cfg.min_lr_ratio)


def progress_of(cfg: TrainConfig, state: TrainState) -> float:
    """The larger of the step fraction and the time fraction (budget 0 = steps only)."""
    return budget_progress(state.step, cfg.steps, state.seconds, cfg.minutes)


@dataclass
class Run:
    """Everything one training run holds."""

    cfg: TrainConfig
    target: Target
    model: EagleModel
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    state: TrainState
    precision: Precision
    scaler: torch.amp.GradScaler
    ranks: Ranks
    objective: torch.nn.Module  # the loss over the model (under DDP when distributed)
    best: dict[str, torch.Tensor] | None = None


def _loss(model: EagleModel, windows: torch.Tensor, features: torch.Tensor | None, target_model, options: tuple):
    """The objective on features computed here (``features`` None) or stored."""
    if features is None:
        return eagle_loss(model, target_model, windows, *options)
    return feature_loss(model, windows, features, *options)


def start_run(cfg: TrainConfig) -> tuple[Run, EagleData]:
    """Load the target and the data, build (draft vocabulary included) or resume the drafter and optimiser."""
    ranks = start(cfg.device)
    precision = Precision.of(cfg.device, cfg.dtype)
    target = load_target(cfg.target, device=precision.device, dtype=torch.float32)
    target.model.requires_grad_(False)
    data = load_data(cfg, target)
    vocab = target_draft_vocab(cfg.draft_vocab, target, data.counted)
    model = build_model(target.model, seed=cfg.seed, vocab=vocab, input_norm=not cfg.reference_form).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    objective = Objective(model, partial(_loss, target_model=target.model,
                                         options=(generator, cfg.noise, cfg.w_reg, cfg.w_cls)))
    run = Run(cfg, target, model, optimizer, generator, TrainState(), precision, precision.scaler(), ranks, objective)
    if cfg.ckpt_path.is_file():
        resume(run)
    run.objective = ranks.wrap(objective, precision.device)
    return run, data


def resume(run: Run) -> None:
    """Continue from the saved training state; refuse a state trained for another target."""
    saved = train_state.read_state(run.cfg.ckpt_path)
    check_target({"target": saved["target"]}, run.target.model, str(run.cfg.ckpt_path))
    vocab = run.model.vocab
    if not torch.equal(saved.get("draft_ids", torch.zeros(0)), vocab.ids if vocab else torch.zeros(0)):
        raise ValueError(f"{run.cfg.ckpt_path} was trained with another draft vocabulary; use another --ckpt")
    saved_form = bool(saved["config"].get("reference_form", False))
    if saved_form != run.cfg.reference_form:
        raise ValueError(f"{run.cfg.ckpt_path} was trained {'with' if saved_form else 'without'} --reference-form; "
                         "resume it the same way or use another --ckpt")
    train_state.restore(run, saved, TrainState)


def save_state(run: Run) -> None:
    """Write the resumable training state (temporary file, then rename), with the draft vocabulary's ids."""
    train_state.save(run, draft_ids=run.model.vocab.ids if run.model.vocab is not None else torch.zeros(0))


def export(run: Run, weights: dict[str, torch.Tensor]) -> None:
    """Write ``weights`` as the drafter in ``--out``."""
    current = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.model.load_state_dict(weights)
    info = {"step": run.state.best_step, "tau": run.state.best_tau, "agreement": run.state.last_agreement,
            "tokens_seen": run.state.tokens_seen, "seconds": round(run.state.seconds, 1), "config": asdict(run.cfg)}
    save_eagle(run.cfg.out, run.model, run.target.model, info, dtype=getattr(torch, run.cfg.save_dtype))
    run.model.load_state_dict(current)


def evaluate(run: Run, data: EagleData) -> None:
    """Top-1 agreement and greedy tau; a better tau becomes the exported drafter."""
    run.model.eval()
    state = run.state
    windows, features = data.heldout
    state.last_agreement = (top1_agreement(run.model, run.target.model, windows) if features is None
                            else feature_agreement(run.model, windows, features))
    prompts = data.prompts
    state.last_tau = measure_tau(run.target, run.model, prompts, run.cfg.tau_tokens) if prompts else float("nan")
    score = state.last_tau if prompts else state.last_agreement
    if score > state.best_tau:
        state.best_tau, state.best_step = score, state.step
        run.best = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        export(run, run.best)
    tqdm.write(f"step {state.step}: top-1 agreement {state.last_agreement:.3f}, tau {state.last_tau:.3f} "
               f"(best {state.best_tau:.3f} at step {state.best_step})")
    run.model.train()


def train_step(run: Run, data: EagleData) -> tuple[float, float, float]:
    """One optimiser step on a random batch: (regression loss, cross-entropy, learning rate)."""
    cfg, state = run.cfg, run.state
    lr = learning_rate(cfg, state.step, progress_of(cfg, state))
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    ranks, device = run.ranks, run.precision.device
    rows, features = data.sample(cfg.batch * ranks.world_size, run.generator)  # the global batch, on every rank
    windows, features = ranks.local(rows), ranks.local(features)
    noise_shape = (windows.shape[0], windows.shape[1] - 1, run.model.hidden_size) if cfg.noise > 0 else None
    ranks.skip_draws(run.generator, noise_shape, ranks.rank)  # this rank's rows of the global batch's noise
    with run.precision.autocast():
        parts = run.objective(windows.to(device), None if features is None else features.to(device))
    ranks.skip_draws(run.generator, noise_shape, ranks.world_size - 1 - ranks.rank)
    optimizer_step(parts.loss, run.optimizer, run.model.parameters(), cfg.clip, run.scaler)
    state.step += 1
    state.tokens_seen += rows.numel()
    return parts.regression, parts.classification, lr


def train(cfg: TrainConfig) -> TrainState:
    """Run (or resume) training until the step or time budget is spent; return the final state."""
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    run, data = start_run(cfg)
    state, ranks = run.state, run.ranks
    try:
        bar = tqdm(total=cfg.steps, initial=state.step, desc="eagle", unit="step", disable=not ranks.is_main)
        while progress_of(cfg, state) < 1.0:
            started = time.perf_counter()
            regression, classification, lr = train_step(run, data)
            evaluating = bool(cfg.eval_every) and state.step % cfg.eval_every == 0
            if evaluating or (cfg.ckpt_every and state.step % cfg.ckpt_every == 0):
                checkpoint(run, data, evaluating)
            state.seconds = ranks.agree(state.seconds + time.perf_counter() - started)  # every rank stops together
            bar.update(1)
            bar.set_postfix(reg=f"{regression:.3f}", ce=f"{classification:.3f}", lr=f"{lr:.1e}")
        bar.close()
        checkpoint(run, data, evaluating=not cfg.eval_every or state.step % cfg.eval_every != 0)
    finally:
        run.objective = unwrap(run.objective)  # free DDP's reducer while the process group is alive
        ranks.close()
    return state


def checkpoint(run: Run, data: EagleData, evaluating: bool) -> None:
    """Rank 0 evaluates (when asked) and writes the training state; every rank waits for it."""
    if run.ranks.is_main:
        if evaluating:
            evaluate(run, data)
        save_state(run)
    run.ranks.barrier()


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Command-line flags from the TrainConfig fields (``--seq-len 256``)."""
    return train_state.parse_config(TrainConfig, "python -m specfamily.drafters.eagle.train", __doc__, argv,
                                    {"device": device_arg, "dtype": dtype_arg})


def main(argv: list[str] | None = None) -> None:
    state = train(parse_args(argv))
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"done: {state.step} steps, best tau {state.best_tau:.3f} at step {state.best_step}")


if __name__ == "__main__":
    main()
