"""The EAGLE-3 training loop: build or resume, step, evaluate the simulated acceptance length, export the best.

Options are :class:`specfamily.drafters.eagle3.train.TrainConfig`'s; the objective is :mod:`.ttt`'s; data parallel
under torchrun through :mod:`specfamily.train.ddp` (rank 0 evaluates, exports and writes the training state).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from specfamily.core.target import Target, load_target
from specfamily.drafters.eagle3.data import Eagle3Data, load_data
from specfamily.drafters.eagle3.formats import save_eagle3
from specfamily.drafters.eagle3.model import Eagle3Model, Eagle3Shape, build_model, default_layers, draft_layer_config
from specfamily.drafters.eagle3.train import TrainConfig
from specfamily.drafters.eagle3.ttt import TTTLoss, heldout_accuracies, simulated_acceptance, target_pass
from specfamily.drafters.shared.draft_vocab import target_draft_vocab
from specfamily.io.identity import check_identity
from specfamily.train import state as train_state
from specfamily.train.ddp import Ranks, start, unwrap
from specfamily.train.precision import Precision, optimizer_step
from specfamily.train.schedule import budget_progress, warmup_cosine

RESUME_FIXED = ("layers", "draft_vocab", "ttt_length", "decay")  # what a resumed run must share with its state


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    tokens_seen: int = 0
    best_acceptance: float = -math.inf
    best_step: int = -1
    last_acceptance: float = math.nan
    last_loss: float = math.nan
    last_accuracies: list[float] = field(default_factory=list)


@dataclass
class Run:
    """Everything one training run holds (``objective``: the TTT loss, under DDP when distributed)."""

    cfg: TrainConfig
    target: Target
    model: Eagle3Model
    objective: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    precision: Precision
    scaler: torch.amp.GradScaler
    ranks: Ranks
    state: TrainState = field(default_factory=TrainState)
    best: dict[str, torch.Tensor] | None = None


def progress_of(cfg: TrainConfig, state: TrainState) -> float:
    """The larger of the step fraction and the time fraction (budget 0 = steps only)."""
    return budget_progress(state.step, cfg.steps, state.seconds, cfg.minutes)


def start_run(cfg: TrainConfig, target: Target | None = None) -> tuple[Run, Eagle3Data]:
    """Join the ranks, load the target and data, build (draft vocabulary included) or resume the drafter."""
    ranks = start(cfg.device)
    precision = Precision.of(cfg.device, cfg.dtype)
    if target is None:
        target = load_target(cfg.target, device=precision.device, dtype=torch.float32)
    elif target.device != precision.device:
        raise ValueError(f"the target given is on {target.device}, not on --device {cfg.device}")
    target.model.requires_grad_(False)
    data = load_data(cfg, target)
    vocab = target_draft_vocab(cfg.draft_vocab, target, data.counted)
    layers = cfg.feature_layers or default_layers(target.num_layers)
    target.check_feature_layers(layers)
    shape = Eagle3Shape(draft_layer_config(target.model), tuple(layers))
    model = build_model(target.model, shape, vocab, seed=cfg.seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    run = Run(cfg, target, model, TTTLoss(model, cfg.ttt_length, cfg.decay), optimizer,
              torch.Generator().manual_seed(cfg.seed), precision, precision.scaler(), ranks)
    if cfg.ckpt_path.is_file():
        resume(run)
    run.objective = ranks.wrap(run.objective, precision.device)
    return run, data


def resume(run: Run) -> None:
    """Continue from the saved training state; refuse one trained for another target or with other options."""
    path = run.cfg.ckpt_path
    saved = train_state.read_state(path)
    check_identity(saved["target"], run.target.model, f"eagle3 training state {str(path)!r}")
    differ = [key for key in RESUME_FIXED if saved["config"].get(key) != getattr(run.cfg, key)]
    if differ:
        raise ValueError(f"cannot resume {path}: options {differ} differ from the saved run; use another --ckpt")
    train_state.restore(run, saved, TrainState)


def save_state(run: Run) -> None:
    """Write the resumable training state (temporary file, then rename)."""
    train_state.save(run)


def export(run: Run, weights: dict[str, torch.Tensor]) -> None:
    """Write ``weights`` as the drafter in ``--out`` (the configured layout and dtype)."""
    current = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.model.load_state_dict(weights)
    save_eagle3(run.model, run.cfg.out, run.target, run.cfg.layout, getattr(torch, run.cfg.save_dtype),
                verifier=run.cfg.base_model or None)
    run.model.load_state_dict(current)


def evaluate(run: Run, data: Eagle3Data) -> None:
    """Per-step held-out accuracies and the simulated acceptance length; a better one becomes the export."""
    run.model.eval()
    state = run.state
    state.last_accuracies, state.last_loss = heldout_accuracies(run.model, run.target.model, data.heldout,
                                                                run.cfg.ttt_length)
    state.last_acceptance = simulated_acceptance(state.last_accuracies)
    if state.last_acceptance > state.best_acceptance:
        state.best_acceptance, state.best_step = state.last_acceptance, state.step
        run.best = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        export(run, run.best)
    accuracies = " ".join(f"{a:.3f}" for a in state.last_accuracies)
    tqdm.write(f"step {state.step}: held-out loss {state.last_loss:.3f}, accuracy by step {accuracies}, simulated "
               f"acceptance {state.last_acceptance:.3f} (best {state.best_acceptance:.3f} at step {state.best_step})")
    run.model.train()


def train_step(run: Run, data: Eagle3Data) -> tuple[float, float]:
    """One optimiser step on this rank's share of a global batch: (weighted loss, learning rate)."""
    cfg, state, ranks = run.cfg, run.state, run.ranks
    lr = warmup_cosine(cfg.lr, state.step, cfg.warmup, progress_of(cfg, state), cfg.min_lr_ratio)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    rows = data.sample(cfg.batch * ranks.world_size, run.generator)  # the global batch, the same on every rank
    windows = ranks.local(rows).to(run.precision.device)
    with run.precision.autocast():
        features, logits = target_pass(run.target.model, windows, run.model.shape.layers)
        result = run.objective(windows, features, logits)
    optimizer_step(result.loss, run.optimizer, run.model.parameters(), cfg.clip, run.scaler)
    state.step += 1
    state.tokens_seen += rows.numel()
    return float(result.loss.detach()), lr


def checkpoint(run: Run, data: Eagle3Data, evaluating: bool) -> None:
    """Rank 0 evaluates (when asked) and writes the training state; every rank waits for it."""
    if run.ranks.is_main:
        if evaluating:
            evaluate(run, data)
        save_state(run)
    run.ranks.barrier()


def train(cfg: TrainConfig, target: Target | None = None) -> TrainState:
    """Run (or resume) training until the step or time budget is spent; return the final state. ``target``: an
    already loaded one (tests)."""
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    run, data = start_run(cfg, target)
    state = run.state
    try:
        bar = tqdm(total=cfg.steps, initial=state.step, desc="eagle3", unit="step", disable=not run.ranks.is_main)
        while progress_of(cfg, state) < 1.0:
            started = time.perf_counter()
            loss, lr = train_step(run, data)
            evaluating = bool(cfg.eval_every) and state.step % cfg.eval_every == 0
            if evaluating or (cfg.ckpt_every and state.step % cfg.ckpt_every == 0):
                checkpoint(run, data, evaluating)
            state.seconds = run.ranks.agree(state.seconds + time.perf_counter() - started)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}")
        bar.close()
        checkpoint(run, data, evaluating=not cfg.eval_every or state.step % cfg.eval_every != 0)
    finally:
        run.objective = unwrap(run.objective)  # free DDP's reducer while the process group is alive
        run.ranks.close()
    return state
