"""The one training loop: every trainer is a :class:`Family` run by :func:`train`.

A family supplies what differs: the model, optimizer and loss (:meth:`Family.build`), one step's loss
(:meth:`Family.step`), a held-out evaluation (:meth:`Family.evaluate`) and what it writes for a new best and at the
end (:meth:`Family.export`, :meth:`Family.finish`). The loop owns the rest:

- the schedule (:class:`Budget`): linear warm-up, then cosine decay to a floor over steps or minutes, whichever
  runs out first;
- checkpoint and resume (:class:`Resumable`): one payload for every trainer, written atomically and read back as
  tensors and plain containers only; an existing checkpoint is loaded before the first step (``resume`` off:
  overwritten);
- data parallel under torchrun (:mod:`specfamily.train.ddp`): only rank 0 evaluates and writes;
- precision: the loss under autocast, one clipped (for float16, scaled) optimiser step;
- the cadence: an evaluation every ``eval_every`` steps and after the last, a checkpoint after every evaluation,
  every ``ckpt_every`` steps and at the end; a better score is kept (``best_score``, ``best_step``) and exported.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import torch
from torch import nn
from tqdm import tqdm

from specfamily.io.files import write_atomically
from specfamily.train.ddp import Ranks, start, unwrap
from specfamily.train.precision import Precision, optimizer_step
from specfamily.train.schedule import budget_progress, warmup_cosine


@dataclass(frozen=True)
class Budget:
    """When training stops and the learning rate on the way there.

    The run stops after ``steps`` steps or once ``minutes`` of training time are spent (0: steps only). The
    learning rate warms up linearly over ``warmup`` steps, then decays by a cosine to ``min_lr_ratio * lr`` as the
    larger of the step and time fractions goes 0 -> 1. ``decay_after_warmup``: the step fraction counts from the end
    of warm-up (Medusa's schedule) instead of from step 0. ``timed_evaluations``: evaluation and checkpoint time
    count against ``minutes`` (else only step time does, the zoo trainer's rule).
    """

    steps: int
    lr: float
    warmup: int
    minutes: float = 0.0
    min_lr_ratio: float = 0.1
    decay_after_warmup: bool = False
    timed_evaluations: bool = True

    def progress(self, step: int, seconds: float) -> float:
        """The fraction of the budget spent after warm-up (>= 1: the cosine is at its floor)."""
        return budget_progress(step, self.steps, seconds, self.minutes, self.warmup if self.decay_after_warmup else 0)

    def learning_rate(self, step: int, seconds: float) -> float:
        """The learning rate of step ``step`` (0-based) after ``seconds`` of training time."""
        return warmup_cosine(self.lr, step, self.warmup, self.progress(step, seconds), self.min_lr_ratio)

    def spent(self, step: int, seconds: float) -> bool:
        return step >= self.steps or (self.minutes > 0 and seconds >= 60 * self.minutes)


@dataclass(frozen=True)
class LoopSettings:
    """What a family tells the loop about its run (from its config)."""

    label: str  # the progress bar's
    budget: Budget
    checkpoint: Path  # the resumable training state
    device: str = "auto"  # auto (a GPU if any), cpu, cuda, cuda:N (torchrun: cuda, each rank on GPU LOCAL_RANK)
    dtype: str = "auto"  # the passes' autocast dtype over float32 weights (auto: bfloat16 on a GPU, else float32)
    clip: float = 1.0  # gradient-norm clip
    eval_every: int = 0  # 0: evaluate after the last step only
    ckpt_every: int = 0  # 0: checkpoint after evaluations and at the end only
    resume: bool = True  # load ``checkpoint`` when it exists

    @classmethod
    def of(cls, cfg: Any, label: str, checkpoint: Path, **schedule: bool) -> LoopSettings:
        """From a trainer's config, by field name (steps, lr, warmup, minutes, min_lr_ratio, device, dtype, clip,
        eval_every, ckpt_every, resume); ``schedule``: :class:`Budget`'s switches."""
        budget = Budget(cfg.steps, cfg.lr, cfg.warmup, cfg.minutes, cfg.min_lr_ratio, **schedule)
        return cls(label, budget, checkpoint, cfg.device, cfg.dtype, cfg.clip, cfg.eval_every, cfg.ckpt_every,
                   cfg.resume)


class LoopState(Protocol):
    """What the loop reads and writes of a family's state dataclass (which its checkpoint stores)."""

    step: int  # optimiser steps done
    seconds: float  # training time spent (the ranks' largest)


class NamedBest:
    """A state dataclass whose ``best_score`` is the field its ``BEST`` names (e.g. ``best_tau``)."""

    BEST: ClassVar[str]

    @property
    def best_score(self) -> float:
        return getattr(self, self.BEST)

    @best_score.setter
    def best_score(self, value: float) -> None:
        setattr(self, self.BEST, value)


S = TypeVar("S", bound=LoopState)


@dataclass
class Trainee(Generic[S]):
    """What one run trains: ``objective`` is the loss over ``model`` (an :class:`~specfamily.train.ddp.Objective`),
    which the loop puts under DistributedDataParallel when distributed; the optimizer updates ``model``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    objective: nn.Module
    state: S
    scaler: torch.amp.GradScaler


@dataclass(frozen=True)
class Step:
    """One step's loss on this rank's rows (a scalar to backpropagate) and what the progress bar shows of it."""

    loss: torch.Tensor
    postfix: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """A held-out evaluation: its log line, the score to select by (higher is better; None: this family does not
    select, its final weights are what :meth:`Family.finish` writes) and what :meth:`Family.export` needs of it."""

    summary: str
    score: float | None = None
    detail: Any = None


class Family(Protocol[S]):
    """What a trainer supplies to the loop. Every method but :meth:`build` and :meth:`step` runs on rank 0 only."""

    settings: LoopSettings

    def build(self, ranks: Ranks, precision: Precision) -> Trainee[S]:
        """Load what the run reads (target, data) and build a fresh model, optimizer, loss and state."""
        ...

    def load(self, trainee: Trainee[S], path: Path) -> None:
        """Restore ``trainee`` (weights, optimizer, scaler, generators, state) from its checkpoint; refuse (ValueError)
        a checkpoint of another run. Runs on every rank, before DistributedDataParallel wraps the loss
        (:class:`Resumable`'s, for the trainers)."""
        ...

    def save(self, trainee: Trainee[S], path: Path) -> None:
        """Write the resumable checkpoint (atomically; :class:`Resumable`'s)."""
        ...

    def step(self, trainee: Trainee[S], ranks: Ranks) -> Step:
        """This rank's loss on its share of the step's global batch, through ``trainee.objective`` (called under
        autocast, before the loop's optimiser step); count what the family counts (tokens seen)."""
        ...

    def evaluate(self, trainee: Trainee[S]) -> Evaluation:
        """Evaluate on held-out data (the model in eval mode); record what the family's state keeps of it."""
        ...

    def export(self, trainee: Trainee[S], evaluation: Evaluation) -> None:
        """Write the model as the best so far (its score beat every earlier one)."""
        ...

    def finish(self, trainee: Trainee[S]) -> None:
        """After the last checkpoint (e.g. export the final weights)."""
        ...


def read_state(path: Path, hint: str = "use another --ckpt") -> dict:
    """A saved training state, tensors and plain containers only: anything else in the file is refused unrun."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"refusing to resume from {str(path)!r}: it holds objects other than tensors and plain "
                         f"containers, which loading would have to run as code ({err}); delete it or {hint}") from None


def check_draft_vocabulary(path: Path, saved: torch.Tensor | None, ids: torch.Tensor | None, hint: str) -> None:
    """Refuse a checkpoint that drafted over other target ids than ``ids`` (None: the full vocabulary)."""
    none = torch.zeros(0)
    if not torch.equal(none if saved is None else saved.cpu(), none if ids is None else ids.cpu()):
        raise ValueError(f"cannot resume {path}: it was trained with another draft vocabulary; {hint}")


class Resumable:
    """Save and load for a family with a dataclass ``cfg``. A family sets its ``model_key``, the config keys a resumed
    run must share (``fixed_options``: a key an older checkpoint lacks counts as at its default), the state fields its
    build measures anew (``kept_state``), the refusals' advice (``hint``), its data ``generator`` if any, and the hooks
    :meth:`check_resume` (run before the fixed options), :meth:`extras` and :meth:`restore`."""

    cfg: Any
    model_key: ClassVar[str] = "model"
    fixed_options: tuple[str, ...] = ()
    kept_state: ClassVar[tuple[str, ...]] = ()
    hint: ClassVar[str] = "use another --ckpt"
    generator: torch.Generator | None = None

    def save(self, trainee: Trainee, path: Path) -> None:
        payload = {self.model_key: trainee.model.state_dict(), "optimizer": trainee.optimizer.state_dict(),
                   "scaler": trainee.scaler.state_dict(), "state": asdict(trainee.state), "config": asdict(self.cfg),
                   **({} if self.generator is None else {"generator": self.generator.get_state()}),
                   **self.extras(trainee)}
        write_atomically(path, lambda tmp: torch.save(payload, tmp))

    def load(self, trainee: Trainee, path: Path) -> None:
        saved = read_state(path, self.hint)
        self.check_resume(trainee, saved, path)
        defaults = {f.name: f.default for f in fields(self.cfg) if f.default is not MISSING}
        changed = [k for k in self.fixed_options if saved["config"].get(k, defaults.get(k)) != getattr(self.cfg, k)]
        if changed:
            raise ValueError(f"cannot resume {path}: options {changed} differ from the saved run; {self.hint}")
        trainee.model.load_state_dict(saved[self.model_key])
        trainee.optimizer.load_state_dict(saved["optimizer"])
        if saved.get("scaler"):
            trainee.scaler.load_state_dict(saved["scaler"])
        if self.generator is not None:
            self.generator.set_state(saved["generator"])
        fresh = trainee.state
        trainee.state = type(fresh)(**{**saved["state"], **{name: getattr(fresh, name) for name in self.kept_state}})
        self.restore(trainee, saved)

    def check_resume(self, trainee: Trainee, saved: dict, path: Path) -> None:
        """Refuse (ValueError) a checkpoint of another run on the family's own grounds (its target, its vocabulary)."""

    def extras(self, trainee: Trainee) -> dict[str, Any]:
        """The family's own entries of the checkpoint."""
        return {}

    def restore(self, trainee: Trainee, saved: dict) -> None:
        """Take back what :meth:`extras` saved."""


def train(family: Family[S]) -> S:
    """Run (or resume) ``family``'s training until its budget is spent; the final state (on every rank)."""
    settings = family.settings
    ranks = start(settings.device)
    trainee = None
    try:
        precision = Precision.of(settings.device, settings.dtype)
        trainee = family.build(ranks, precision)
        if settings.resume and settings.checkpoint.is_file():
            family.load(trainee, settings.checkpoint)
            if ranks.is_main and trainee.state.step:
                tqdm.write(f"resumed from {settings.checkpoint} at step {trainee.state.step}")
        trainee.objective = ranks.wrap(trainee.objective, precision.device)
        _run(family, trainee, ranks, precision)
    finally:
        if trainee is not None:
            trainee.objective = unwrap(trainee.objective)  # free DDP's reducer while the process group is alive
        ranks.close()
    return trainee.state


def _run(family: Family[S], trainee: Trainee[S], ranks: Ranks, precision: Precision) -> None:
    settings, state = family.settings, trainee.state
    budget = settings.budget
    bar = tqdm(total=budget.steps, initial=state.step, desc=settings.label, unit="step", dynamic_ncols=True,
               disable=not ranks.is_main)
    evaluated = None  # whether this session's last step was evaluated; None: no step ran
    while not budget.spent(state.step, state.seconds):
        started = time.perf_counter()
        lr = budget.learning_rate(state.step, state.seconds)
        for group in trainee.optimizer.param_groups:
            group["lr"] = lr
        with precision.autocast():
            step = family.step(trainee, ranks)
        optimizer_step(step.loss, trainee.optimizer, trainee.model.parameters(), settings.clip, trainee.scaler)
        state.step += 1
        state.seconds = ranks.agree(state.seconds + time.perf_counter() - started)  # every rank stops together
        evaluated = _due(state.step, settings.eval_every)
        _checkpoint(family, trainee, ranks, evaluated, evaluated or _due(state.step, settings.ckpt_every))
        bar.update(1)
        bar.set_postfix(**step.postfix, lr=f"{lr:.1e}")
    bar.close()
    if evaluated is False:  # the last step is always evaluated, and the state saved after it
        _checkpoint(family, trainee, ranks, evaluating=True, saving=True)
    if ranks.is_main:
        family.finish(trainee)
    ranks.barrier()


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def _checkpoint(family: Family[S], trainee: Trainee[S], ranks: Ranks, evaluating: bool, saving: bool) -> None:
    """Rank 0 evaluates (and keeps a better score) and saves, as asked; every rank waits for it. The time it
    takes counts against the budget when the budget says so."""
    if not (evaluating or saving):
        return
    started = time.perf_counter()
    if ranks.is_main:
        if evaluating:
            _evaluate(family, trainee)
        if saving:
            family.save(trainee, family.settings.checkpoint)
    ranks.barrier()
    if family.settings.budget.timed_evaluations:
        trainee.state.seconds = ranks.agree(trainee.state.seconds + time.perf_counter() - started)


def _evaluate(family: Family[S], trainee: Trainee[S]) -> None:
    state = trainee.state
    trainee.model.eval()
    evaluation = family.evaluate(trainee)
    trainee.model.train()
    best = ""
    if evaluation.score is not None:
        if evaluation.score > state.best_score:
            state.best_score, state.best_step = evaluation.score, state.step
            family.export(trainee, evaluation)
        best = f" (best {state.best_score:.3f} at step {state.best_step})"
    tqdm.write(f"step {state.step}: {evaluation.summary}{best}")
