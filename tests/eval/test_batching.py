"""The runner's load settings: batch_size / arrival_rate / batched checked with one-line errors, seeded Poisson
arrivals, a request's timing."""

from __future__ import annotations

import math
import statistics

import pytest
from omegaconf import OmegaConf

from specfamily.eval.batching import BatchSettings, RequestTiming, poisson_arrivals
from specfamily.eval.config import ConfigError, check_config, resume_fingerprint


def test_the_defaults_are_the_batch_1_path():
    settings = BatchSettings.from_config(OmegaConf.create({}))
    assert settings == BatchSettings(1, None, False) and not settings.batched
    assert BatchSettings.from_config(OmegaConf.create({"batch_size": 1, "arrival_rate": None})).batched is False


@pytest.mark.parametrize(("config", "batched"), [
    ({"batch_size": 4}, True), ({"arrival_rate": 2}, True), ({"batched": True}, True), ({"batch_size": 1}, False),
])
def test_what_takes_the_batched_arm(config, batched):
    settings = BatchSettings.from_config(OmegaConf.create(config))
    assert settings.batched is batched
    rate = settings.arrival_rate
    assert rate == config.get("arrival_rate") and (rate is None or isinstance(rate, float))


@pytest.mark.parametrize(("config", "message"), [
    ({"batch_size": 0}, "batch_size: must be an integer >= 1 (requests decoded at once), got 0"),
    ({"batch_size": 2.5}, "batch_size: must be an integer >= 1 (requests decoded at once), got 2.5"),
    ({"batch_size": True}, "batch_size: must be an integer >= 1 (requests decoded at once), got True"),
    ({"batch_size": "4"}, "batch_size: must be an integer >= 1 (requests decoded at once), got '4'"),
    ({"arrival_rate": 0}, "arrival_rate: must be a positive number of requests per second or null (all at once), "
                          "got 0"),
    ({"arrival_rate": -1.5}, "arrival_rate: must be a positive number of requests per second or null (all at "
                             "once), got -1.5"),
    ({"arrival_rate": float("inf")}, "got inf"),
    ({"arrival_rate": "fast"}, "got 'fast'"),
    ({"batched": "yes"}, "batched: must be true or false, got 'yes'"),
])
def test_bad_values_are_one_line_config_errors(config, message, compose_config):
    with pytest.raises(ValueError) as caught:
        BatchSettings.from_config(OmegaConf.create(config))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    cfg = compose_config(["model.target=/no/such/model", "drafter=prompt_lookup"])
    cfg.update(config)
    with pytest.raises(ConfigError) as caught:  # the run's own check, before any model loads
        check_config(cfg)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_poisson_arrivals_are_seeded_start_at_zero_and_have_the_rate():
    assert poisson_arrivals(5, None, 0) is None  # all at once
    assert poisson_arrivals(0, 2.0, 0) == []
    times = poisson_arrivals(4000, 4.0, seed=3)
    assert times == poisson_arrivals(4000, 4.0, seed=3) and times != poisson_arrivals(4000, 4.0, seed=4)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == 0.0 and all(gap >= 0 for gap in gaps)
    # exponential gaps of mean 1 / rate: the mean of 3999 is within 5 standard errors (sd = mean for the exponential)
    assert abs(statistics.fmean(gaps) - 0.25) < 5 * 0.25 / math.sqrt(len(gaps))
    assert abs(statistics.pstdev(gaps) - 0.25) < 0.03


def test_request_timing():
    timing = RequestTiming(arrival=1.0, first_token=1.5, finish=3.0)
    assert (timing.latency, timing.ttft, timing.tokens_per_second(8)) == (2.0, 0.5, 4.0)
    assert math.isnan(RequestTiming(0.0, math.nan, 0.0).tokens_per_second(3))


def test_the_resume_fingerprint_names_the_load_only_when_it_is_not_batch_1():
    base = {"model": 1, "drafter": 2, "dataset": 3, "sampling": 4, "seed": 0}
    assert resume_fingerprint({**base, "batch_size": 1, "arrival_rate": None, "batched": False}) == base
    assert resume_fingerprint(base) == base  # a run from before the load settings resumes
    assert resume_fingerprint({**base, "batch_size": 8, "arrival_rate": None, "batched": False}) == {
        **base, "batch_size": 8, "arrival_rate": None, "batched": False}
