"""What each EAGLE variant brings to the family's trainer (:mod:`specfamily.drafters.eagle.train`): its network,
objective, half of a step, evaluation score, export and resume checks.

- :class:`EagleTraining` (EAGLE-1/2): feature regression + soft labels (:mod:`.objective`); scored by greedy tau
  on held-out prompts (top-1 agreement without prompts); our format.
- :class:`Eagle3Training` (EAGLE-3): the training-time test (:mod:`.ttt`); scored by the simulated acceptance
  length; the EAGLE/SpecForge or speculators layout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, ClassVar, Protocol

import torch

from specfamily.core.target import Target
from specfamily.drafters.eagle.checkpoint import save_eagle
from specfamily.drafters.eagle.data import EagleData
from specfamily.drafters.eagle.formats3 import save_eagle3
from specfamily.drafters.eagle.model import DraftNetwork, build_model
from specfamily.drafters.eagle.model3 import Eagle3Shape, default_layers, draft_layer_config
from specfamily.drafters.eagle.model3 import build_model as build_eagle3_model
from specfamily.drafters.eagle.objective import eagle_loss, feature_agreement, feature_loss, measure_tau, top1_agreement
from specfamily.drafters.eagle.train_config import CommonTrainConfig, Eagle3TrainConfig, TrainConfig
from specfamily.drafters.eagle.ttt import TTTLoss, heldout_accuracies, simulated_acceptance, target_pass
from specfamily.drafters.shared.draft_vocab import DraftVocab
from specfamily.train.ddp import Objective, Ranks
from specfamily.train.loop import NamedBest, check_draft_vocabulary
from specfamily.train.precision import Precision


@dataclass
class Counters(NamedBest):
    """What every variant's training state counts (saved with it; ``BEST`` names the score to beat)."""

    step: int = 0
    seconds: float = 0.0
    tokens_seen: int = 0
    best_step: int = -1


@dataclass
class TrainState(Counters):
    """EAGLE-1/2's counters and evaluations."""

    best_tau: float = float("-inf")
    last_agreement: float = float("nan")
    last_tau: float = float("nan")

    BEST: ClassVar[str] = "best_tau"


@dataclass
class Eagle3TrainState(Counters):
    """EAGLE-3's counters and evaluations."""

    best_acceptance: float = -math.inf
    last_acceptance: float = math.nan
    last_loss: float = math.nan
    last_accuracies: list[float] = field(default_factory=list)

    BEST: ClassVar[str] = "best_acceptance"


class Run(Protocol):
    """What the variants read of a run: the family the loop trains (:class:`.train.EagleRun`)."""

    cfg: Any
    target: Target
    model: DraftNetwork
    objective: torch.nn.Module  # the loss over ``model``, under DDP when distributed
    generator: torch.Generator  # the data's and the feature noise's
    precision: Precision
    ranks: Ranks
    state: Any


class Variant:
    """The variant-specific parts of the trainer (``name``: the registered drafter's; ``loss_names``: what
    ``step``'s shown losses are called on the progress bar). Contracts:

    - ``build(cfg, target, vocab)``: a freshly initialised network for ``target``, in training mode;
    - ``objective(cfg, model, target, generator)``: the loss over ``model`` as a module (what DDP wraps);
    - ``step(run, rows, features)``: (differentiable loss, shown losses) of this rank's share of the global batch
      (called under autocast);
    - ``evaluate(run, data)``: fill the state's last evaluations, return the score the best export must beat;
      ``report(state)``: that evaluation in a line (the loop adds the step and the best); ``summary(state)``: the
      run's last line;
    - ``save(run)``: write the model's current weights as the drafter in ``--out``;
    - ``fixed_options``: the config keys a resumed run must share with its state (the loop's check);
      ``check_resume(run, saved)``: refuse a state on the variant's own further grounds (the target is the run's);
    - ``state_extra(run)``: entries saved with the training state beside the common ones.
    """

    name: str
    state_type: type
    loss_names: tuple[str, ...]
    fixed_options: tuple[str, ...] = ()

    def check_resume(self, run: Run, saved: dict) -> None:
        pass

    def state_extra(self, run: Run) -> dict[str, Any]:
        return {}


def _loss(model, windows: torch.Tensor, features: torch.Tensor | None, target_model, options: tuple):
    """The EAGLE-1/2 objective on features computed here (``features`` None) or stored."""
    if features is None:
        return eagle_loss(model, target_model, windows, *options)
    return feature_loss(model, windows, features, *options)


class EagleTraining(Variant):
    name, state_type, loss_names = "eagle", TrainState, ("reg", "ce")

    def build(self, cfg: TrainConfig, target: Target, vocab: DraftVocab | None) -> DraftNetwork:
        return build_model(target.model, seed=cfg.seed, vocab=vocab, input_norm=not cfg.reference_form).train()

    def objective(self, cfg: TrainConfig, model, target: Target, generator: torch.Generator) -> torch.nn.Module:
        return Objective(model, partial(_loss, target_model=target.model,
                                        options=(generator, cfg.noise, cfg.w_reg, cfg.w_cls)))

    def step(self, run: Run, rows: torch.Tensor, features: torch.Tensor | None) -> tuple[torch.Tensor, tuple]:
        ranks, device = run.ranks, run.precision.device
        windows, features = ranks.local(rows), ranks.local(features)
        noise_shape = (windows.shape[0], windows.shape[1] - 1, run.model.hidden_size) if run.cfg.noise > 0 else None
        ranks.skip_draws(run.generator, noise_shape, ranks.rank)  # this rank's rows of the global batch's noise
        parts = run.objective(windows.to(device), None if features is None else features.to(device))
        ranks.skip_draws(run.generator, noise_shape, ranks.world_size - 1 - ranks.rank)
        return parts.loss, (parts.regression, parts.classification)

    def evaluate(self, run: Run, data: EagleData) -> float:
        """Top-1 agreement and greedy tau (the score; agreement when there are no prompts)."""
        state = run.state
        windows, features = data.heldout
        state.last_agreement = (top1_agreement(run.model, run.target.model, windows) if features is None
                                else feature_agreement(run.model, windows, features))
        prompts = data.prompts
        state.last_tau = measure_tau(run.target, run.model, prompts, run.cfg.tau_tokens) if prompts else float("nan")
        return state.last_tau if prompts else state.last_agreement

    def report(self, state: TrainState) -> str:
        return f"top-1 agreement {state.last_agreement:.3f}, tau {state.last_tau:.3f}"

    def save(self, run: Run) -> None:
        state = run.state
        info = {"step": state.best_step, "tau": state.best_tau, "agreement": state.last_agreement,
                "tokens_seen": state.tokens_seen, "seconds": round(state.seconds, 1), "config": asdict(run.cfg)}
        save_eagle(run.cfg.out, run.model, run.target.model, info, dtype=getattr(torch, run.cfg.save_dtype))

    def check_resume(self, run: Run, saved: dict) -> None:
        vocab = run.model.vocab
        check_draft_vocabulary(run.cfg.ckpt_path, saved.get("draft_ids"), vocab.ids if vocab else None,
                               "use another --ckpt")
        saved_form = bool(saved["config"].get("reference_form", False))
        if saved_form != run.cfg.reference_form:
            raise ValueError(f"{run.cfg.ckpt_path} was trained {'with' if saved_form else 'without'} "
                             "--reference-form; resume it the same way or use another --ckpt")

    def state_extra(self, run: Run) -> dict[str, Any]:
        return {"draft_ids": run.model.vocab.ids if run.model.vocab is not None else torch.zeros(0)}

    def summary(self, state: TrainState) -> str:
        return f"done: {state.step} steps, best tau {state.best_tau:.3f} at step {state.best_step}"


class Eagle3Training(Variant):
    name, state_type, loss_names = "eagle3", Eagle3TrainState, ("loss",)
    fixed_options = ("layers", "draft_vocab", "ttt_length", "decay")

    def build(self, cfg: Eagle3TrainConfig, target: Target, vocab: DraftVocab | None) -> DraftNetwork:
        layers = cfg.feature_layers or default_layers(target.num_layers)
        target.check_feature_layers(layers)
        shape = Eagle3Shape(draft_layer_config(target.model), tuple(layers))
        return build_eagle3_model(target.model, shape, vocab, seed=cfg.seed).train()

    def objective(self, cfg: Eagle3TrainConfig, model, target: Target, generator) -> torch.nn.Module:
        return TTTLoss(model, cfg.ttt_length, cfg.decay)

    def step(self, run: Run, rows: torch.Tensor, features: torch.Tensor | None) -> tuple[torch.Tensor, tuple]:
        """Stored features (distillation data) are the last layer only: every layer's come online here."""
        windows = run.ranks.local(rows).to(run.precision.device)
        features, logits = target_pass(run.target.model, windows, run.model.shape.layers)
        result = run.objective(windows, features, logits)
        return result.loss, (float(result.loss.detach()),)

    def evaluate(self, run: Run, data: EagleData) -> float:
        """Per-step held-out accuracies and the simulated acceptance length (the score)."""
        state = run.state
        state.last_accuracies, state.last_loss = heldout_accuracies(run.model, run.target.model, data.heldout[0],
                                                                    run.cfg.ttt_length)
        state.last_acceptance = simulated_acceptance(state.last_accuracies)
        return state.last_acceptance

    def report(self, state: Eagle3TrainState) -> str:
        accuracies = " ".join(f"{a:.3f}" for a in state.last_accuracies)
        return (f"held-out loss {state.last_loss:.3f}, accuracy by step {accuracies}, simulated acceptance "
                f"{state.last_acceptance:.3f}")

    def save(self, run: Run) -> None:
        save_eagle3(run.model, run.cfg.out, run.target, run.cfg.layout, getattr(torch, run.cfg.save_dtype),
                    verifier=run.cfg.base_model or None)

    def summary(self, state: Eagle3TrainState) -> str:
        return (f"done: {state.step} steps, best simulated acceptance {state.best_acceptance:.3f} at step "
                f"{state.best_step}")


def variant_for(cfg: CommonTrainConfig) -> Variant:
    """The variant a config trains: :class:`Eagle3TrainConfig` -> eagle3, :class:`TrainConfig` -> eagle."""
    return Eagle3Training() if isinstance(cfg, Eagle3TrainConfig) else EagleTraining()
