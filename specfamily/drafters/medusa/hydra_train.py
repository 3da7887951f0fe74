"""Train Hydra heads on a frozen target: ``python -m specfamily.drafters.medusa.hydra_train key=value ...``.

Medusa's trainer with Hydra heads: the same data (``distilled=DIR`` or token streams), loop, schedule, selection by
tau and resumable state (``configs/train/hydra.yaml`` holds the keys, Medusa's). Loss: sum over heads k of decay**k
* CE(head k at t given the tokens t + 1 .. t + 1 + k, token t + 2 + k), teacher-forced on the training text;
``objective=distill`` replaces each CE by KL from the target's own distribution of that token (Hydra++'s teacher
distillation, :mod:`specfamily.drafters.medusa.objective`). Each evaluation builds the joint rank table of the heads
on held-out windows (teacher forcing is exact: a node is only reached when the tokens above it were right), chooses
the tree from it, the target's verify cost and the heads' proposal cost, and measures tau with the Hydra drafter.
"""

from __future__ import annotations

import argparse
import os

import torch
from tqdm import tqdm

from specfamily.drafters.medusa.calibrate import Calibration, calibrate
from specfamily.drafters.medusa.checkpoint import load_checkpoint
from specfamily.drafters.medusa.hydra_checkpoint import HYDRA
from specfamily.drafters.medusa.hydra_drafter import HydraDrafter, measure_hydra_cost
from specfamily.drafters.medusa.hydra_heads import (
    HydraHeads,
    build_hydra,
    hydra_from_medusa,
    hydra_logits,
    hydra_loss,
    hydra_rank_table,
    hydra_shape_for,
    rank_accuracies,
)
from specfamily.drafters.medusa.train import HeadsContext, MedusaTraining, TrainState
from specfamily.drafters.medusa.train_config import TrainConfig
from specfamily.drafters.shared.draft_vocab import target_draft_vocab
from specfamily.drafters.shared.greedy_tau import greedy_tau
from specfamily.train import loop
from specfamily.train.config import add_flags, from_args
from specfamily.train.loop import Evaluation, Trainee
from specfamily.train.precision import device_arg, dtype_arg


def evaluate_hydra(context: HeadsContext, heads: HydraHeads) -> tuple[Calibration, float]:
    """The tree chosen from the joint ranks on the held-out greedy text, and the tau it reaches (greedy)."""
    cfg, greedy = context.cfg, context.data.greedy
    heads.eval()
    table = hydra_rank_table(heads, greedy.features, greedy.ids, cfg.ranks, greedy.start, cfg.batch)
    cal = calibrate(rank_accuracies(table, cfg.ranks), table, context.curve, context.c, cfg.max_nodes)
    drafter = HydraDrafter.from_heads(context.target, heads, tree=cal.tree, policy="constant")
    tau = greedy_tau(context.target, drafter, context.data.prompts, cfg.eval_tokens)
    heads.train()
    return cal, tau


class HydraTraining(MedusaTraining):
    """Medusa's training family with Hydra heads, their cost, loss and evaluation; exported in Hydra's format."""

    kind, label = HYDRA, "hydra heads"
    loss = staticmethod(hydra_loss)
    logits = staticmethod(hydra_logits)

    def initial_heads(self, context: HeadsContext) -> HydraHeads:
        """A warm start from Medusa heads (``init``: proposes what they propose until it learns otherwise), else
        fresh Hydra heads of the configured shape."""
        cfg = self.cfg
        if cfg.init:
            return hydra_from_medusa(context.target, load_checkpoint(cfg.init, context.target)[0])
        vocab = target_draft_vocab(cfg.draft_vocab, context.target, context.data.counted)
        shape = hydra_shape_for(context.target, cfg.num_heads, cfg.layers, cfg.share_lm_head, cfg.draft_vocab)
        return build_hydra(context.target, shape, vocab)

    def measure_cost(self, context: HeadsContext, heads: HydraHeads) -> None:
        """c of the nominal tree (the one untrained heads draft): the tree is chosen against this fixed cost."""
        context.c = measure_hydra_cost(HydraDrafter.from_heads(context.target, heads.eval()), context.seconds_per_pass)

    def evaluate(self, trainee: Trainee[TrainState]) -> Evaluation:
        state = trainee.state
        cal, tau = evaluate_hydra(self.context, trainee.model)
        row = {"step": state.step, "seconds": round(state.seconds, 1), "tau": tau, "loss": self.per_head,
               "top1": cal.top1, "top5": cal.top5, "tree_nodes": len(cal.tree),
               "expected_accepted": cal.expected_accepted}
        state.history.append(row)
        summary = (f"tau {tau:.3f}; teacher-forced top1 {[round(a, 3) for a in cal.top1]}; tree {len(cal.tree)} "
                   f"nodes, expected accepted {cal.expected_accepted:.3f}")
        return Evaluation(summary, tau, cal)


def train(cfg: TrainConfig, target=None) -> TrainState:
    """Train (or resume) Hydra heads for ``cfg.target``; returns the final state."""
    return loop.train(HydraTraining(cfg, target))


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    parser = argparse.ArgumentParser(prog="python -m specfamily.drafters.medusa.hydra_train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, TrainConfig, {"max-minutes": "minutes"}, {"device": device_arg, "dtype": dtype_arg})
    return from_args(TrainConfig, "hydra", parser.parse_args(argv), parser)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    torch.set_num_threads(cfg.threads)
    if cfg.recalibrate:
        raise SystemExit("recalibrate is not implemented for Hydra heads yet")
    state = train(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        tqdm.write(f"done: {state.step} steps in {state.seconds / 60:.1f} min, best tau {state.best_tau:.3f} "
                   f"at step {state.best_step}")


if __name__ == "__main__":
    main()
