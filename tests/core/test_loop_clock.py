"""The loop's clock: plain perf_counter on CPU, a CUDA synchronise before every read on a CUDA device, read at every
boundary of the draft / verify split."""

from __future__ import annotations

import re
import time

import pytest
import torch

import specfamily as sf
import specfamily.core.loop as loop
from specfamily.core.loop import device_clock
from specfamily.testing import RandomTreeDrafter, tiny_target


def test_cpu_clock_is_perf_counter_itself():
    assert device_clock(torch.device("cpu")) is time.perf_counter
    assert device_clock("cpu") is time.perf_counter


def test_cuda_clock_synchronises_its_device_before_each_read(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    clock = device_clock("cuda:1")
    before = time.perf_counter()
    first, second = clock(), clock()
    assert synced == [torch.device("cuda", 1)] * 2
    assert before <= first <= second <= time.perf_counter()


def test_a_cpu_run_never_synchronises_cuda(monkeypatch):
    def refuse(device=None):
        raise AssertionError("torch.cuda.synchronize called on a CPU run")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    result = sf.generate(target, RandomTreeDrafter(target, gamma=3, nodes=6), [1, 2, 3], max_new_tokens=8)
    assert len(result.tokens) == 8 and result.metrics.verify_seconds > 0


def test_the_clock_is_read_at_every_timed_boundary(monkeypatch):
    """With a stand-in for a CUDA device's clock (it logs a sync and returns 0, 1, 2, ...): one read before the
    proposal, one between proposal and target pass, one after the commit, and the metrics are its differences."""
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    drafter = RandomTreeDrafter(target, gamma=3, nodes=6)
    events, devices = [], []

    def fake_clock() -> float:
        events.append("sync")
        return float(events.count("sync") - 1)

    def clock_for(device):
        devices.append(device)
        return fake_clock

    def logged(name, fn):
        def wrapper(*args, **kwargs):
            events.append(name)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(loop, "device_clock", clock_for)
    monkeypatch.setattr(drafter, "propose", logged("propose", drafter.propose))
    monkeypatch.setattr(target, "forward", logged("forward", target.forward))
    monkeypatch.setattr(target, "commit", logged("commit", target.commit))
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=10)
    assert devices == [target.device]
    passes = result.metrics.target_passes
    body = [e for e in events if e in ("sync", "propose", "forward", "commit")]
    assert body[0] == "sync" and body[-1] == "sync"  # the request's start and end
    one_pass = r"sync (propose )?sync forward commit sync "  # no proposal when one token is left
    assert re.fullmatch(f"({one_pass}){{{passes}}}", " ".join(body[1:-1]) + " ")
    assert body.count("propose") >= passes - 1
    assert result.metrics.draft_seconds == passes and result.metrics.verify_seconds == passes
    assert result.metrics.total_seconds == events.count("sync") - 1


def test_the_first_request_clock_starts_after_the_one_time_cost_measurement():
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    drafter = sf.create_drafter("prompt_lookup", target)  # cost-aware: the loop measures t(g + 1) / t(1) once
    assert target.verify_costs is None
    start = time.perf_counter()
    first = sf.generate(target, drafter, [1, 2, 3, 1, 2], max_new_tokens=6)
    wall = time.perf_counter() - start
    assert target.verify_costs is not None and first.metrics.calibration_seconds > 0
    assert first.metrics.total_seconds <= wall - first.metrics.calibration_seconds
    again = sf.generate(target, drafter, [1, 2, 3, 1, 2], max_new_tokens=6)
    assert again.metrics.calibration_seconds == 0.0  # measured once per target


class _Recorder:
    def __init__(self):
        self.updates = []

    def update(self, *args, **kwargs):
        self.updates.append((args, kwargs))


def test_c_leaves_catch_up_out_and_every_drafted_pass_reports_its_catch_up():
    """The catch-up goes to the policy on every drafted pass (the policy tells a steady backlog from an idle
    stretch's: test_policy_probes.py), never into c; a plain pass reports neither."""
    draft = sf.Draft.chain([4, 5, 6])
    draft.catch_up_seconds = 0.5
    policy = _Recorder()
    loop._report(policy, draft, 3, [0], draft_seconds=0.8, verify_seconds=0.1)
    (args, kwargs), = policy.updates
    assert args[:2] == (3, 1)
    assert args[2] == pytest.approx((0.8 - 0.5) / 3 / 0.1) and kwargs["overhead"] == pytest.approx(5.0)
    assert kwargs["verified"] == 2
    loop._report(policy, sf.Draft.empty(), 0, [], draft_seconds=0.0, verify_seconds=0.1)
    assert policy.updates[-1][0][:3] == (0, 0, None) and policy.updates[-1][1]["overhead"] is None
    loop._report(policy, sf.Draft.empty(), 0, [], draft_seconds=0.02, verify_seconds=0.1, asked=True)
    assert policy.updates[-1][0][:2] == (0, 0) and policy.updates[-1][0][2] == pytest.approx(0.2)


class _Empty(sf.BaseDrafter):
    """Asked for 2 tokens on every other pass (its policy alternates 2 and 0), never finds anything."""

    def __init__(self):
        super().__init__(2, "constant")
        self.policy = _Alternating()

    def propose(self, ctx, gamma):
        return sf.Draft.empty()


class _Alternating(_Recorder):
    def __init__(self):
        super().__init__()
        self.asked = 0

    def reset(self):
        pass

    def next_gamma(self):
        self.asked += 1
        return 2 * (self.asked % 2)


def test_an_empty_draft_the_drafter_was_asked_for_reports_its_proposals_time_and_a_pass_not_asked_none():
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    drafter = _Empty()
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=9)
    assert result.tokens == sf.generate(target, None, [1, 2, 3], max_new_tokens=9).tokens
    cs = [args[2] for args, _ in drafter.policy.updates]
    assert all(args[:2] == (0, 0) for args, _ in drafter.policy.updates) and len(cs) == 8
    assert [c is None for c in cs] == [False, True] * 4  # asked on passes 1, 3, ...: the proposal timed
    assert all(c >= 0 for c in cs[::2])


@pytest.mark.parametrize("name", ["eagle", "eagle3"])
def test_eagle_reports_its_catch_up_apart_from_its_draft_steps(name):
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    drafter = sf.create_drafter(name, target, weights="random", gamma=2, mode="chain")
    result = sf.generate(target, drafter, list(range(1, 30)), max_new_tokens=8)
    metrics = result.metrics
    assert 0 < metrics.catch_up_seconds < metrics.draft_seconds


def test_the_policy_is_timed_on_cpu_time_on_one_thread_and_on_the_loops_clock_otherwise(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert loop._planning_clock(torch.device("cpu")) is time.process_time
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert loop._planning_clock(torch.device("cpu")) is None
    assert loop._planning_clock(torch.device("cuda", 0)) is None


class _EmptyInBatches(_Empty):
    """Asked for 2 tokens on every pass, never finds anything; one policy for every batch slot (``batch_shared``)."""

    batch_shared = ("policy",)

    def __init__(self):
        super().__init__()
        self.policy = _Always()


class _Always(_Alternating):
    def next_gamma(self):
        return 2


def test_a_batched_request_asked_for_a_draft_that_came_back_empty_reports_its_share_of_the_proposal():
    """generate_batch's slots report as generate does: a pass whose drafter was asked and found nothing tells the
    policy its share of the proposal's time as c (it reported None, as for a pass not asked)."""
    target = tiny_target("llama", vocab_size=32, dtype=torch.float32)
    drafter = _EmptyInBatches()
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    results = sf.generate_batch(target, drafter, prompts, max_new_tokens=6, max_batch=3)
    assert [r.tokens for r in results] == [r.tokens for r in sf.generate_batch(target, None, prompts, 6)]
    cs = [args[2] for args, _ in drafter.policy.updates]
    assert all(args[:2] == (0, 0) for args, _ in drafter.policy.updates) and len(cs) == 15  # a request's last pass
    assert all(c is not None and c >= 0 for c in cs), cs  # reports nothing: it is done
