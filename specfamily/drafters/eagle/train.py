"""Train an EAGLE drafter for a frozen target: ``python -m specfamily.drafters.eagle.train target=T out=DIR``
(EAGLE-1/2) or ``python -m specfamily.drafters.eagle.train --variant eagle3 target=T out=DIR`` (EAGLE-3).

Configured like runs: ``configs/train/eagle.yaml`` (``eagle3.yaml``) holds every key and its default, ``key=value``
overrides them, the ``--flag value`` form works too (``--help``); :class:`EagleRun` runs on the one loop.

Data: a token array (``--tokens``), any HF dataset (``--dataset json --data-files a.jsonl``) or self-distillation
data (``--distilled``); features come from the target on the fly. ``--draft-vocab N`` drafts over the N most
frequent training tokens.

- ``eagle``: feature regression + soft labels; evaluated by top-1 agreement on held-out windows and greedy tau on
  held-out prompts, the best tau exported to ``--out``. ``--reference-form`` trains the layer without its input
  norm, so that it can be exported in the EAGLE repository's layout.
- ``eagle3``: the training-time test (:mod:`specfamily.drafters.eagle.ttt`) over three target layers (``--layers``);
  evaluated by the simulated acceptance length, the best exported in the EAGLE/SpecForge layout (``--layout
  speculators`` for vLLM's).

Training state goes to ``ckpt`` (default ``<out>.train.pt``) and a rerun resumes from it; ``device``, ``dtype`` and
``torchrun`` work as for every trainer on the loop.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from specfamily.core.target import Target
from specfamily.drafters.eagle.data import EagleData, load_data
from specfamily.drafters.eagle.train_config import CommonTrainConfig, Eagle3TrainConfig, TrainConfig
from specfamily.drafters.eagle.training import Variant, variant_for
from specfamily.drafters.shared.draft_vocab import target_draft_vocab
from specfamily.io.identity import check_identity, target_identity
from specfamily.train import loop
from specfamily.train.config import add_flags, from_args
from specfamily.train.ddp import Ranks
from specfamily.train.loop import Evaluation, LoopSettings, Resumable, Step, Trainee
from specfamily.train.precision import Precision, device_arg, dtype_arg, frozen_target

__all__ = ["EagleRun", "Eagle3TrainConfig", "TrainConfig", "main", "parse_args", "train", "train_step"]

PROG = "python -m specfamily.drafters.eagle.train"
CONFIGS = {"eagle": TrainConfig, "eagle3": Eagle3TrainConfig}


class EagleRun(Resumable):
    """An EAGLE variant's training as a :class:`specfamily.train.loop.Family`: selected by the variant's held-out
    score (tau, or EAGLE-3's simulated acceptance), exported in the variant's format, resumable from
    ``cfg.ckpt_path`` (with the target's identity and the best weights). It is also the ``run`` the variant's parts
    read (:class:`~.training.Variant`)."""

    def __init__(self, cfg: CommonTrainConfig, target: Target | None = None) -> None:
        self.cfg, self.target = cfg, target
        self.variant: Variant = variant_for(cfg)
        self.fixed_options = self.variant.fixed_options
        self.settings = LoopSettings.of(cfg, self.variant.name, cfg.ckpt_path)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.best: dict[str, torch.Tensor] | None = None  # the best evaluation's weights (saved with the state)
        self.trainee: Trainee | None = None

    @property
    def objective(self) -> torch.nn.Module:
        return self.trainee.objective

    @property
    def state(self):
        return self.trainee.state

    def build(self, ranks: Ranks, precision: Precision) -> Trainee:
        """Load the target (unless given) and the data, build the draft vocabulary, the network and its optimiser."""
        cfg, self.ranks, self.precision = self.cfg, ranks, precision
        self.target = frozen_target(cfg.target, precision.device, cfg.device, self.target, precision.frozen_dtype)
        self.data: EagleData = load_data(cfg, self.target)
        vocab = target_draft_vocab(cfg.draft_vocab, self.target, self.data.counted)
        self.model = model = self.variant.build(cfg, self.target, vocab)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        objective = self.variant.objective(cfg, model, self.target, self.generator)
        self.trainee = Trainee(model, optimizer, objective, self.variant.state_type(), precision.scaler())
        return self.trainee

    def check_resume(self, trainee: Trainee, saved: dict, path: Path) -> None:
        """Refuse a state trained for another target, then the variant's own checks."""
        check_identity(saved["target"], self.target.model, f"{self.variant.name} training state {str(path)!r}",
                       self.hint)
        self.variant.check_resume(self, saved)

    def extras(self, trainee: Trainee) -> dict:
        return {"target": target_identity(self.target.model), "best": self.best, **self.variant.state_extra(self)}

    def restore(self, trainee: Trainee, saved: dict) -> None:
        self.best = saved["best"]

    def step(self, trainee: Trainee, ranks: Ranks) -> Step:
        loss, shown = train_step(self, self.data)
        return Step(loss, {name: f"{value:.3f}" for name, value in zip(self.variant.loss_names, shown, strict=True)})

    def evaluate(self, trainee: Trainee) -> Evaluation:
        score = self.variant.evaluate(self, self.data)
        return Evaluation(self.variant.report(trainee.state), score)

    def export(self, trainee: Trainee, evaluation: Evaluation) -> None:
        """Keep the current weights as the best and write them as the drafter in ``out``."""
        self.best = {k: v.detach().clone() for k, v in trainee.model.state_dict().items()}
        self.variant.save(self)

    def finish(self, trainee: Trainee) -> None:
        """Nothing more: the best drafter was exported as it came."""


def train_step(run: EagleRun, data: EagleData) -> tuple[torch.Tensor, tuple[float, ...]]:
    """This rank's loss on its share of a random global batch (the same rows on every rank) and the variant's shown
    losses; the batch's tokens are counted."""
    rows, features = data.sample(run.cfg.batch * run.ranks.world_size, run.generator)
    run.state.tokens_seen += rows.numel()
    return run.variant.step(run, rows, features)


def train(cfg: CommonTrainConfig, target: Target | None = None):
    """Run (or resume) training until the step or time budget is spent; return the final state (the variant's
    TrainState). ``target``: an already loaded one (tests)."""
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    return loop.train(EagleRun(cfg, target))


def parse_args(argv: list[str] | None = None) -> CommonTrainConfig:
    """``--variant eagle|eagle3`` (default eagle), then ``key=value`` overrides of ``configs/train/<variant>.yaml``
    or the older flags (``--seq-len 256``)."""
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument("--variant", choices=tuple(CONFIGS), default="eagle")
    known, rest = chooser.parse_known_args(argv)
    parser = argparse.ArgumentParser(prog=PROG if known.variant == "eagle" else f"{PROG} --variant {known.variant}",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, CONFIGS[known.variant], checked={"device": device_arg, "dtype": dtype_arg})
    return from_args(CONFIGS[known.variant], known.variant, parser.parse_args(rest), parser)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    state = train(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        print(variant_for(cfg).summary(state))


if __name__ == "__main__":
    main()
