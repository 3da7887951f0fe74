"""Train Medusa heads on a frozen target: ``python -m specfamily.drafters.medusa.train key=value ...``.

Configured like runs: ``configs/train/medusa.yaml`` holds every key and its default, the command line overrides
them (``target=zoo:smollm2 data=my.jsonl minutes=60``; the ``--flag value`` form works too, ``--help``). The loop is
:mod:`specfamily.train.loop`'s.

Loss: sum over heads k of decay**k * cross-entropy(head k at position t, token at t + 2 + k); ``objective=distill``:
KL from the target's own next-token distribution at t + 1 + k instead (:mod:`specfamily.drafters.medusa.objective`).
Each evaluation measures per-head accuracy on held-out windows (as written and as the target's greedy continuation),
chooses a tree from the latter's joint rank statistics and this machine's verify cost, and measures tau with it; the
best tau is exported. ``recalibrate=CHECKPOINT`` only re-chooses a checkpoint's tree for this machine.

``distilled=DIR`` trains on self-distillation data with its stored features (no target pass per step).
``draft_vocab=N`` drafts over the N most frequent training tokens (FR-Spec; EOS always in); labels outside them are
ignored by the loss and count as misses.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from tqdm import tqdm

from specfamily.drafters.medusa.calibrate import (
    Calibration,
    calibrate,
    head_accuracies,
    measure_heads_cost,
    measure_verify_cost,
    rank_table,
    target_features,
)
from specfamily.drafters.medusa.checkpoint import MEDUSA, MedusaCheckpoint, load_checkpoint, resolve, save_checkpoint
from specfamily.drafters.medusa.data import MedusaData, load_data, vocab_report
from specfamily.drafters.medusa.heads import MedusaHeads, build_heads, shape_for
from specfamily.drafters.medusa.objective import argmax_labels, distill_objective, medusa_logits, medusa_loss
from specfamily.drafters.medusa.train_config import TrainConfig
from specfamily.drafters.medusa.tree import CostCurve
from specfamily.drafters.shared.draft_vocab import target_draft_vocab
from specfamily.drafters.shared.greedy_tau import greedy_tau
from specfamily.io.identity import target_identity
from specfamily.train import loop
from specfamily.train.config import add_flags, from_args
from specfamily.train.ddp import Objective, Ranks
from specfamily.train.loop import Evaluation, LoopSettings, NamedBest, Resumable, Step, Trainee, check_draft_vocabulary
from specfamily.train.precision import Precision, device_arg, dtype_arg, frozen_target


@dataclass
class TrainState(NamedBest):
    step: int = 0
    seconds: float = 0.0
    best_tau: float = -math.inf
    best_step: int = -1
    history: list[dict] = field(default_factory=list)  # one row per evaluation
    draft_vocab: dict = field(default_factory=dict)  # size and coverage of the draft vocabulary, if any

    BEST: ClassVar[str] = "best_tau"  # what the loop selects by


def measure_tau(target, heads: MedusaHeads, tree, prompts: list[list[int]], max_new_tokens: int) -> float:
    """tau = new tokens / target passes over the prompts (greedy), with the shared verifier."""
    from specfamily.drafters.medusa.drafter import MedusaDrafter

    drafter = MedusaDrafter.from_heads(target, heads, tree=tree, policy="constant")  # tau independent of timings
    return greedy_tau(target, drafter, prompts, max_new_tokens)


@dataclass
class HeadsContext:
    """What training and recalibrating heads read besides the heads: the target, the data (held-out sets included)
    and the measured costs."""

    cfg: TrainConfig
    target: object
    data: MedusaData
    curve: CostCurve
    seconds_per_pass: float  # t(1)
    c: float = math.nan  # the heads' proposal cost relative to t(1), measured once the heads exist

    def measure_heads(self, heads: MedusaHeads) -> None:
        self.c = measure_heads_cost(heads, self.cfg.ranks, self.seconds_per_pass)


def evaluate(context: HeadsContext, heads: MedusaHeads) -> tuple[Calibration, float, torch.Tensor]:
    """The tree chosen from accuracies on the target's own greedy text, the tau it reaches, and the accuracies
    (K, ranks) on the held-out text itself."""
    cfg = context.cfg
    heads.eval()
    corpus, greedy = context.data.corpus, context.data.greedy
    acc = head_accuracies(heads, greedy.features, greedy.ids, cfg.ranks, greedy.start, cfg.batch)
    corpus_acc = acc if corpus is greedy else head_accuracies(heads, corpus.features, corpus.ids, cfg.ranks,
                                                              corpus.start, cfg.batch)
    ranks = rank_table(heads, greedy.features, greedy.ids, cfg.ranks, greedy.start, cfg.batch)
    cal = calibrate(acc, ranks, context.curve, context.c, cfg.max_nodes)
    tau = measure_tau(context.target, heads, cal.tree, context.data.prompts, cfg.eval_tokens)
    heads.train()
    return cal, tau, corpus_acc


def open_context(cfg: TrainConfig, target=None) -> HeadsContext:
    """The frozen target (``target``: an already loaded one), the data and the target's verify cost."""
    precision = Precision.of(cfg.device, cfg.dtype)
    target = frozen_target(cfg.target, precision.device, cfg.device, target, precision.frozen_dtype, matmul=cfg.matmul)
    data = load_data(cfg, target)
    curve, t1 = measure_verify_cost(target, max_size=cfg.max_nodes + 1)
    return HeadsContext(cfg, target, data, curve, t1)


def train(cfg: TrainConfig, target=None) -> TrainState:
    """Train (or resume) heads for ``cfg.target``; returns the final state. ``target``: an already loaded one."""
    return loop.train(MedusaTraining(cfg, target))


class MedusaTraining(Resumable):
    """Medusa heads as a :class:`specfamily.train.loop.Family`: selected by the tau they reach, exported as
    safetensors + JSON (``kind``'s format), resumable from ``out/state.pt`` (the heads under ``heads``; the draft
    vocabulary's report is measured anew). Hydra's trainer overrides the heads, their cost, loss and evaluation."""

    model_key, kept_state, hint = "heads", ("draft_vocab",), "use a new out"
    fixed_options = ("target", "num_heads", "layers", "share_lm_head", "seq_len", "data", "distilled", "draft_vocab")
    kind, label = MEDUSA, "medusa heads"
    loss = staticmethod(medusa_loss)  # (heads, features, ids, decay) -> (loss, per-head losses)
    logits = staticmethod(medusa_logits)  # (heads, features, ids) -> per-head teacher-forced logits (distill)

    def __init__(self, cfg: TrainConfig, target=None) -> None:
        self.cfg, self.target = cfg, target
        # the cosine runs over the steps after warm-up; evaluations count against the minutes
        self.settings = LoopSettings.of(cfg, self.label, Path(cfg.out) / "state.pt", decay_after_warmup=True)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.per_head: list[float] = []  # the last step's loss of each head

    def build(self, ranks: Ranks, precision: Precision) -> Trainee[TrainState]:
        cfg = self.cfg
        self.context = context = open_context(cfg, self.target)
        heads = self.initial_heads(context)
        vocab = heads.vocab
        self.measure_cost(context, heads)
        heads.train()
        optimizer = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        state = TrainState(draft_vocab=vocab_report(vocab, context.data))
        if vocab is not None and ranks.is_main:
            tqdm.write(f"draft vocabulary: {vocab.size} tokens, coverage {state.draft_vocab['coverage_train']:.3f} "
                       f"of the training tokens, {state.draft_vocab['coverage_heldout']:.3f} held out")
        loss = self.objective_loss(context)
        objective = Objective(heads, lambda h, ids, f: _step_loss(context, h, ids, f, loss))
        return Trainee(heads, optimizer, objective, state, precision.scaler())

    def objective_loss(self, context: HeadsContext):
        """The loss ``objective`` names: the family's cross-entropy, or distillation from the target's LM head."""
        if self.cfg.objective == "ce":
            return self.loss
        lm_head = context.target.model.get_output_embeddings()
        return distill_objective(self.logits, lm_head, self.cfg.distill_temperature)

    def initial_heads(self, context: HeadsContext) -> MedusaHeads:
        """The heads training starts from: ``init``'s (a warm start: their shape and draft vocabulary), else fresh
        heads of the configured shape over the draft vocabulary counted on the training data."""
        cfg = self.cfg
        if cfg.init:
            return load_checkpoint(cfg.init, context.target)[0]
        vocab = target_draft_vocab(cfg.draft_vocab, context.target, context.data.counted)
        shape = shape_for(context.target, cfg.num_heads, cfg.layers, cfg.share_lm_head, cfg.draft_vocab)
        return build_heads(context.target, shape, vocab)

    def measure_cost(self, context: HeadsContext, heads: MedusaHeads) -> None:
        """c, the heads' proposal cost relative to t(1), which the tree is chosen against."""
        context.measure_heads(heads)

    def check_resume(self, trainee: Trainee[TrainState], saved: dict, path: Path) -> None:
        ids = trainee.model.draft_ids if trainee.model.vocab is not None else None
        check_draft_vocabulary(path, saved["heads"].get("draft_ids"), ids, self.hint)

    def step(self, trainee: Trainee[TrainState], ranks: Ranks) -> Step:
        ids, features = self.context.data.sample(self.cfg.batch * ranks.world_size, self.generator)  # global batch
        loss, self.per_head = trainee.objective(ranks.local(ids), ranks.local(features))
        return Step(loss, {"loss": f"{loss.item():.3f}", "head0": f"{self.per_head[0]:.3f}"})

    def evaluate(self, trainee: Trainee[TrainState]) -> Evaluation:
        state = trainee.state
        cal, tau, corpus_acc = evaluate(self.context, trainee.model)
        row = {"step": state.step, "seconds": round(state.seconds, 1), "tau": tau, "loss": self.per_head,
               "top1": cal.top1, "top5": cal.top5, "corpus_top1": corpus_acc[:, 0].tolist(),
               "corpus_top5": corpus_acc[:, :5].sum(dim=1).tolist(), "tree_nodes": len(cal.tree),
               "expected_accepted": cal.expected_accepted}
        state.history.append(row)
        summary = (f"tau {tau:.3f}; on greedy text top1 {_rounded(cal.top1)} top5 {_rounded(cal.top5)}; on held-out "
                   f"text top1 {_rounded(row['corpus_top1'])} top5 {_rounded(row['corpus_top5'])}; tree "
                   f"{len(cal.tree)} nodes")
        return Evaluation(summary, tau, cal)

    def export(self, trainee: Trainee[TrainState], evaluation: Evaluation) -> None:
        cfg, cal, state, heads = self.cfg, evaluation.detail, trainee.state, trainee.model
        training = {"step": state.step, "data": self.context.data.source, "config": asdict(cfg),
                    "draft_vocab": state.draft_vocab}
        meta = MedusaCheckpoint(heads.shape, target_identity(self.context.target.model), cal.tree,
                                {**cal.as_dict(), "tau": evaluation.score}, training)
        save_checkpoint(cfg.export or Path(cfg.out) / "heads", heads, meta, getattr(torch, cfg.save_dtype), self.kind)

    def finish(self, trainee: Trainee[TrainState]) -> None:
        """Nothing more: the best heads were exported as they came."""


def _step_loss(context: HeadsContext, heads: MedusaHeads, ids: torch.Tensor, features: torch.Tensor | None,
               loss=medusa_loss) -> tuple[torch.Tensor, list[float]]:
    """The training loss on one batch of windows (B, T): the target's features (computed unless stored), then the
    heads' ``loss``."""
    cfg, device = context.cfg, context.target.device
    ids = ids.to(device)
    features = target_features(context.target.model, ids) if features is None else features.to(device)
    if cfg.labels == "argmax":
        ids = argmax_labels(context.target.model.get_output_embeddings(), features, ids)
    return loss(heads, features, ids, cfg.decay)


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 3) for v in values]


def recalibrate(cfg: TrainConfig, target=None) -> Calibration:
    """Re-choose the tree of the checkpoint ``cfg.recalibrate`` for this machine; written to ``cfg.export`` (default:
    in place)."""
    context = open_context(cfg, target)
    heads, meta = load_checkpoint(cfg.recalibrate, context.target)
    if heads.shape.output_size < cfg.ranks:
        raise ValueError(f"--ranks {cfg.ranks} exceeds the checkpoint's draft vocabulary of {heads.shape.output_size}")
    context.measure_heads(heads)
    cal, tau, _ = evaluate(context, heads)
    tqdm.write(f"recalibrated: tau {tau:.3f}, top1 {[round(a, 3) for a in cal.top1]}, tree {len(cal.tree)} nodes")
    meta.tree, meta.calibration = cal.tree, {**cal.as_dict(), "tau": tau}
    save_checkpoint(cfg.export or resolve(cfg.recalibrate), heads, meta, dtype=getattr(torch, cfg.save_dtype))
    return cal


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The config from ``key=value`` overrides of ``configs/train/medusa.yaml``, or from the older flags."""
    parser = argparse.ArgumentParser(prog="python -m specfamily.drafters.medusa.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, TrainConfig, {"max-minutes": "minutes"}, {"device": device_arg, "dtype": dtype_arg})
    return from_args(TrainConfig, "medusa", parser.parse_args(argv), parser)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    torch.set_num_threads(cfg.threads)
    if cfg.recalibrate:
        recalibrate(cfg)
        return
    state = train(cfg)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"done: {state.step} steps in {state.seconds / 60:.1f} min, best tau {state.best_tau:.3f} "
              f"at step {state.best_step}")


if __name__ == "__main__":
    main()
