"""The one training loop (specfamily.train.loop) on a toy family: the schedule, the cadence of evaluations and
checkpoints, held-out selection, and resume (an interrupted run ends where an uninterrupted one does)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch

from specfamily.train import loop
from specfamily.train.ddp import Objective
from specfamily.train.loop import Budget, Evaluation, LoopSettings, Step, Trainee


@dataclass
class ToyState:
    step: int = 0
    seconds: float = 0.0
    best_score: float = -math.inf
    best_step: int = -1
    rows: int = 0


class Toy:
    """Fit y = 3x on random batches; the score is minus the held-out error."""

    def __init__(self, path: Path, steps: int = 6, eval_every: int = 2, ckpt_every: int = 0, select: bool = True,
                 crash_at: int = -1):
        self.crash_at = crash_at
        self.settings = LoopSettings("toy", Budget(steps, lr=0.1, warmup=1), path, eval_every=eval_every,
                                     ckpt_every=ckpt_every)
        self.select, self.generator = select, torch.Generator().manual_seed(0)
        self.log: list[tuple[str, int]] = []

    def build(self, ranks, precision) -> Trainee[ToyState]:
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1, bias=False)
        objective = Objective(model, lambda m, x: ((m(x) - 3 * x) ** 2).mean())
        return Trainee(model, torch.optim.SGD(model.parameters(), lr=0.1), objective, ToyState(), precision.scaler())

    def load(self, trainee, path) -> None:
        saved = torch.load(path, weights_only=True)
        trainee.model.load_state_dict(saved["model"])
        trainee.optimizer.load_state_dict(saved["optimizer"])
        self.generator.set_state(saved["generator"])
        trainee.state = ToyState(**saved["state"])

    def save(self, trainee, path) -> None:
        self.log.append(("save", trainee.state.step))
        torch.save({"model": trainee.model.state_dict(), "optimizer": trainee.optimizer.state_dict(),
                    "generator": self.generator.get_state(), "state": asdict(trainee.state)}, path)

    def step(self, trainee, ranks) -> Step:
        if trainee.state.step == self.crash_at:
            raise RuntimeError("interrupted")
        x = torch.randn(4, 1, generator=self.generator)
        trainee.state.rows += 4
        return Step(trainee.objective(x))

    def evaluate(self, trainee) -> Evaluation:
        self.log.append(("evaluate", trainee.state.step))
        assert not trainee.model.training
        error = float((trainee.model.weight.detach() - 3).abs())
        return Evaluation(f"error {error:.3f}", -error if self.select else None)

    def export(self, trainee, evaluation) -> None:
        self.log.append(("export", trainee.state.step))

    def finish(self, trainee) -> None:
        self.log.append(("finish", trainee.state.step))


def test_evaluations_checkpoints_and_selection_follow_the_cadence(tmp_path):
    toy = Toy(tmp_path / "toy.pt", steps=5, eval_every=2, ckpt_every=3)
    state = loop.train(toy)
    assert (state.step, state.rows) == (5, 20)
    assert toy.log == [("evaluate", 2), ("export", 2), ("save", 2), ("save", 3), ("evaluate", 4), ("export", 4),
                       ("save", 4), ("evaluate", 5), ("export", 5), ("save", 5), ("finish", 5)]
    assert state.best_step == 5 and state.best_score > -3  # the error falls at every evaluation here


def test_without_a_score_nothing_is_selected_and_the_end_is_evaluated_once(tmp_path):
    toy = Toy(tmp_path / "toy.pt", steps=4, eval_every=2, select=False)
    state = loop.train(toy)
    assert toy.log == [("evaluate", 2), ("save", 2), ("evaluate", 4), ("save", 4), ("finish", 4)]
    assert state.best_step == -1


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    whole = Toy(tmp_path / "whole.pt", steps=6)
    loop.train(whole)
    with pytest.raises(RuntimeError, match="interrupted"):
        loop.train(Toy(tmp_path / "split.pt", steps=6, crash_at=3))  # the state was saved at step 2
    second = Toy(tmp_path / "split.pt", steps=6)
    state = loop.train(second)
    assert state.step == 6 and state.rows == 24 and second.log[0] == ("evaluate", 4)
    assert torch.equal(torch.load(tmp_path / "whole.pt")["model"]["weight"],
                       torch.load(tmp_path / "split.pt")["model"]["weight"])
    finished = Toy(tmp_path / "split.pt", steps=6)
    assert loop.train(finished).step == 6 and finished.log == [("finish", 6)]  # nothing left to do


@pytest.mark.parametrize("after_warmup", [False, True])
def test_the_schedule_warms_up_then_decays_over_steps_or_minutes(after_warmup):
    budget = Budget(steps=110, lr=1.0, warmup=10, minutes=1.0, min_lr_ratio=0.1, decay_after_warmup=after_warmup)
    assert budget.learning_rate(0, 0.0) == pytest.approx(0.1) and budget.learning_rate(9, 0.0) == pytest.approx(1.0)
    middle = 60 if after_warmup else 55  # half of the steps after warm-up, or half of all steps
    assert budget.learning_rate(middle, 0.0) == pytest.approx(0.55)
    assert budget.learning_rate(middle, 30.0) == pytest.approx(0.55)  # half the minutes: the same point
    assert budget.learning_rate(20, 60.0) == pytest.approx(0.1)  # the time ran out first
    assert not budget.spent(109, 59.0) and budget.spent(110, 0.0) and budget.spent(5, 60.0)
