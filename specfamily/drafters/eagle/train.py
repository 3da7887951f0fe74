"""Train an EAGLE drafter for a frozen target: ``python -m specfamily.drafters.eagle.train --target T --out DIR``
(EAGLE-1/2) or ``python -m specfamily.drafters.eagle.train --variant eagle3 --target T --out DIR`` (EAGLE-3).

Data is a token array (``--tokens``, e.g. the zoo corpus ``work/zoo/train.npy``), any HF dataset (``--dataset
json --data-files a.jsonl``) or self-distillation data (``--distilled``, ``specfamily-zoo distill``); features come
from the target on the fly (EAGLE-1/2 also reads the stored last-layer features of distillation data; EAGLE-3 fuses
three layers and recomputes them). ``--draft-vocab N`` drafts over the N most frequent training tokens.

- ``eagle``: feature regression + soft labels. Every ``--eval-every`` steps: top-1 agreement with the target on
  held-out windows and greedy tau through the shared verifier on held-out prompts; the drafter with the best tau is
  exported to ``--out`` (safetensors + config.json). ``--reference-form`` trains the draft layer without its input
  norm, as EAGLE's layer 0 has none, so that ``specfamily-zoo export --drafter eagle --layout eagle`` can write it
  in the EAGLE repository's layout.
- ``eagle3``: the training-time test (:mod:`specfamily.drafters.eagle.ttt`): the draft unrolled ``--ttt-length``
  steps (default 7) over its own outputs, soft-label cross-entropy against the target at every step, step weights
  0.8^s. Features of three target layers (``--layers`` or the reference's). Every ``--eval-every`` steps the
  per-step top-1 accuracies on held-out windows give the simulated acceptance length (1 + sum of their running
  products); the best is exported to ``--out`` in the EAGLE/SpecForge layout (``--layout speculators`` for vLLM's),
  which ``sf.create_drafter("eagle3", target, weights=DIR)`` loads.

Training state (weights, optimiser, data RNG, best weights) goes to ``--ckpt`` (default ``<out>.train.pt``) and a
rerun resumes from it; the state file is read as tensors and plain containers only (``torch.load(weights_only=
True)``), so a state file from elsewhere cannot run code. ``--device cuda`` trains on a GPU; ``--dtype bfloat16``
(or float16) runs the passes under autocast with float32 master weights. Under ``torchrun`` each rank trains a
DistributedDataParallel replica on its share of every global batch (``--batch`` rows per rank;
:mod:`specfamily.train.ddp`): ``torchrun --nproc-per-node 2 -m specfamily.drafters.eagle.train --variant eagle3 ...``
(gloo on CPU; ``--device cuda`` uses NCCL and GPU LOCAL_RANK). Rank 0 evaluates and writes.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from tqdm import tqdm

from specfamily.core.target import Target, load_target
from specfamily.drafters.eagle.data import EagleData, load_data
from specfamily.drafters.eagle.train_config import CommonTrainConfig, Eagle3TrainConfig, TrainConfig
from specfamily.drafters.eagle.training import Run, variant_for
from specfamily.drafters.shared.draft_vocab import target_draft_vocab
from specfamily.train import state as train_state
from specfamily.train.ddp import start, unwrap
from specfamily.train.precision import Precision, device_arg, dtype_arg, optimizer_step
from specfamily.train.schedule import budget_progress, warmup_cosine

__all__ = ["Eagle3TrainConfig", "TrainConfig", "main", "parse_args", "train", "train_step"]

PROG = "python -m specfamily.drafters.eagle.train"
CONFIGS = {"eagle": TrainConfig, "eagle3": Eagle3TrainConfig}


def progress_of(cfg: CommonTrainConfig, state) -> float:
    """The larger of the step fraction and the time fraction (budget 0 = steps only)."""
    return budget_progress(state.step, cfg.steps, state.seconds, cfg.minutes)


def start_run(cfg: CommonTrainConfig, target: Target | None = None) -> tuple[Run, EagleData]:
    """Join the ranks, load the target (unless given) and the data, build (draft vocabulary included) or resume
    the drafter and optimiser."""
    variant = variant_for(cfg)
    ranks = start(cfg.device)
    precision = Precision.of(cfg.device, cfg.dtype)
    if target is None:
        target = load_target(cfg.target, device=precision.device, dtype=torch.float32)
    elif target.device != precision.device:
        raise ValueError(f"the target given is on {target.device}, not on --device {cfg.device}")
    target.model.requires_grad_(False)
    data = load_data(cfg, target)
    vocab = target_draft_vocab(cfg.draft_vocab, target, data.counted)
    model = variant.build(cfg, target, vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    objective = variant.objective(cfg, model, target, generator)
    run = Run(cfg, variant, target, model, objective, optimizer, generator, precision, precision.scaler(), ranks,
              variant.state_type())
    if cfg.ckpt_path.is_file():
        resume(run)
    run.objective = ranks.wrap(objective, precision.device)
    return run, data


def resume(run: Run) -> None:
    """Continue from the saved training state, after the variant's checks (target, fixed options)."""
    saved = train_state.read_state(run.cfg.ckpt_path)
    run.variant.check_resume(run, saved)
    train_state.restore(run, saved, run.variant.state_type)


def save_state(run: Run) -> None:
    """Write the resumable training state (temporary file, then rename)."""
    train_state.save(run, **run.variant.state_extra(run))


def export(run: Run, weights: dict[str, torch.Tensor]) -> None:
    """Write ``weights`` as the drafter in ``--out`` (the variant's format, the configured dtype)."""
    current = {k: v.clone() for k, v in run.model.state_dict().items()}
    run.model.load_state_dict(weights)
    run.variant.save(run)
    run.model.load_state_dict(current)


def evaluate(run: Run, data: EagleData) -> None:
    """The variant's evaluation; a better score than the best so far becomes the exported drafter."""
    run.model.eval()
    state = run.state
    score = run.variant.evaluate(run, data)
    if score > getattr(state, state.BEST):
        setattr(state, state.BEST, score)
        state.best_step = state.step
        run.best = {k: v.detach().clone() for k, v in run.model.state_dict().items()}
        export(run, run.best)
    tqdm.write(run.variant.report(state))
    run.model.train()


def train_step(run: Run, data: EagleData) -> tuple[float, ...]:
    """One optimiser step on this rank's share of a random global batch: (the variant's shown losses..., lr)."""
    cfg, state = run.cfg, run.state
    lr = warmup_cosine(cfg.lr, state.step, cfg.warmup, progress_of(cfg, state), cfg.min_lr_ratio)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    rows, features = data.sample(cfg.batch * run.ranks.world_size, run.generator)  # the same on every rank
    loss, shown = run.variant.step(run, rows, features)
    optimizer_step(loss, run.optimizer, run.model.parameters(), cfg.clip, run.scaler)
    state.step += 1
    state.tokens_seen += rows.numel()
    return (*shown, lr)


def checkpoint(run: Run, data: EagleData, evaluating: bool) -> None:
    """Rank 0 evaluates (when asked) and writes the training state; every rank waits for it."""
    if run.ranks.is_main:
        if evaluating:
            evaluate(run, data)
        save_state(run)
    run.ranks.barrier()


def train(cfg: CommonTrainConfig, target: Target | None = None):
    """Run (or resume) training until the step or time budget is spent; return the final state (the variant's
    TrainState). ``target``: an already loaded one (tests)."""
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    run, data = start_run(cfg, target)
    state, ranks, names = run.state, run.ranks, run.variant.loss_names
    try:
        bar = tqdm(total=cfg.steps, initial=state.step, desc=run.variant.name, unit="step", disable=not ranks.is_main)
        while progress_of(cfg, state) < 1.0:
            started = time.perf_counter()
            *losses, lr = train_step(run, data)
            evaluating = bool(cfg.eval_every) and state.step % cfg.eval_every == 0
            if evaluating or (cfg.ckpt_every and state.step % cfg.ckpt_every == 0):
                checkpoint(run, data, evaluating)
            state.seconds = ranks.agree(state.seconds + time.perf_counter() - started)  # every rank stops together
            bar.update(1)
            bar.set_postfix({name: f"{loss:.3f}" for name, loss in zip(names, losses, strict=True)}, lr=f"{lr:.1e}")
        bar.close()
        checkpoint(run, data, evaluating=not cfg.eval_every or state.step % cfg.eval_every != 0)
    finally:
        run.objective = unwrap(run.objective)  # free DDP's reducer while the process group is alive
        ranks.close()
    return state


def parse_args(argv: list[str] | None = None) -> CommonTrainConfig:
    """``--variant eagle|eagle3`` (default eagle), then flags from that variant's config fields (``--seq-len 256``)."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--variant", choices=tuple(CONFIGS), default="eagle")
    known, rest = chooser.parse_known_args(argv)
    prog = PROG if known.variant == "eagle" else f"{PROG} --variant {known.variant}"
    return train_state.parse_config(CONFIGS[known.variant], prog, __doc__, rest,
                                    {"device": device_arg, "dtype": dtype_arg})


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    state = train(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        print(variant_for(cfg).summary(state))


if __name__ == "__main__":
    main()
