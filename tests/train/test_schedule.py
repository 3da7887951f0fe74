import pytest

from specfamily.train.schedule import budget_progress, warmup_cosine


def test_warmup_then_cosine_to_the_floor():
    assert warmup_cosine(1.0, 0, 10, 0.0) == pytest.approx(0.1)
    assert warmup_cosine(1.0, 9, 10, 0.0) == pytest.approx(1.0)
    assert warmup_cosine(1.0, 50, 10, 0.5, min_lr_ratio=0.2) == pytest.approx(0.6)
    assert warmup_cosine(1.0, 50, 10, 1.0) == pytest.approx(0.1)
    assert warmup_cosine(1.0, 50, 10, 3.0) == pytest.approx(0.1)  # held at the floor past the budget


def test_progress_is_the_larger_of_steps_and_time():
    assert budget_progress(50, 100) == 0.5
    assert budget_progress(50, 100, seconds=90, minutes=2) == 0.75
    assert budget_progress(50, 100, seconds=90, minutes=0) == 0.5  # no time budget
    assert budget_progress(10, 110, warmup=10) == 0.0 and budget_progress(60, 110, warmup=10) == 0.5
