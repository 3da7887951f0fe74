import math

import numpy as np
import pytest
import torch

import specfamily as sf
from specfamily.core.memory import CUDA_ALLOCATED, RSS_PEAK, PeakMemory
from specfamily.core.trace import BONUS, TARGET, Trace, percentile, token_latencies, token_origins
from specfamily.testing import OracleDrafter, RandomTreeDrafter, tiny_target


def _trace(passes):
    """A Trace from (draft_tokens, parents, accepted, bonus, kept) tuples; times are irrelevant here."""
    trace = Trace()
    for end, (tokens, parents, accepted, bonus, kept) in enumerate(passes):
        trace.draft_tokens.append(tokens)
        trace.parents.append(parents)
        trace.accepted.append(accepted)
        trace.bonus.append(bonus)
        trace.kept.append(kept)
        trace.draft_seconds.append(0.0)
        trace.verify_seconds.append(0.0)
        trace.end_seconds.append(float(end))
    return trace


def test_origins_tell_accepted_depth_bonus_and_target_apart():
    trace = _trace([
        ([], [], [], 7, 1),  # prefill: the target's token
        ([3, 4, 5], [-1, 0, 1], [0, 1, 2], 9, 4),  # a chain accepted to its end: its next token is the bonus
        ([3, 4, 5], [-1, 0, 1], [0], 8, 2),  # rejected at depth 2: the target's token after one accepted
        ([3, 4, 5, 6], [-1, -1, 0, 1], [1, 3], 2, 3),  # tree: the path 1 -> 3 ends at a leaf: bonus
        ([3, 4, 5, 6], [-1, -1, 0, 1], [0], 2, 2),  # tree: node 0 has a child (2) that was rejected: target
        ([3, 4], [-1, 0], [0, 1], 5, 2),  # the budget cut the bonus token off
    ])
    assert token_origins(trace) == [TARGET, 1, 2, 3, BONUS, 1, TARGET, 1, 2, BONUS, 1, TARGET, 1, 2]


def test_latencies_share_each_pass_interval_among_its_tokens():
    assert token_latencies([0.5, 1.0, 1.9, 2.0], [1, 2, 3, 1]) == pytest.approx([0.25, 0.25, 0.3, 0.3, 0.3, 0.1])
    assert token_latencies([0.5], [1]) == []


def test_percentile_matches_numpy_linear():
    values = [0.3, 0.1, 0.25, 0.9, 0.4, 0.05, 0.3]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], 50))


def test_trace_round_trips_through_json_columns():
    trace = _trace([([], [], [], 7, 1), ([3, 4], [-1, 0], [0], 9, 2)])
    trace.draft_seconds[1] = 0.12345678
    data = trace.as_dict()
    assert data["draft_seconds"] == [0.0, 0.123457]
    assert Trace.from_dict(data).accepted == [[], [0]]


@pytest.mark.parametrize("drafter_kind", ["tree", "oracle"])
def test_generate_trace_replays_the_committed_tokens(drafter_kind):
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    if drafter_kind == "tree":
        drafter = RandomTreeDrafter(target, gamma=3, nodes=8)
    else:
        drafter = OracleDrafter(target, gamma=4)
    result = sf.generate(target, drafter, [5, 9, 2, 33, 7], max_new_tokens=30)
    trace, metrics = result.trace, result.metrics
    assert len(trace) == metrics.target_passes
    replay = []
    for tokens, accepted, bonus, kept in zip(trace.draft_tokens, trace.accepted, trace.bonus, trace.kept, strict=True):
        replay += [*(tokens[i] for i in accepted), bonus][:kept]
    assert replay == result.tokens
    assert sum(len(a) for a in trace.accepted) == metrics.accepted_tokens
    assert sum(trace.draft_seconds) == pytest.approx(metrics.draft_seconds)
    assert sum(trace.verify_seconds) == pytest.approx(metrics.verify_seconds)
    assert trace.verify_seconds[0] == metrics.prefill_seconds
    assert max(len(t) for t in trace.draft_tokens) >= 4  # the passes really drafted (8-node trees / depth-4 chains)
    origins = token_origins(trace)
    assert len(origins) == len(result.tokens) and max(origins) >= (3 if drafter_kind == "oracle" else 1)
    if drafter_kind == "oracle":  # alpha = 1: every full pass ends with a bonus token
        assert origins.count(BONUS) >= 4 and TARGET not in origins


def test_latency_metrics_come_from_the_pass_times():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    result = sf.generate(target, RandomTreeDrafter(target, gamma=3, nodes=8), [1, 2, 3], max_new_tokens=24)
    m, trace = result.metrics, result.trace
    assert m.time_to_first_token == trace.end_seconds[0]
    assert m.prefill_seconds <= m.time_to_first_token <= m.total_seconds
    assert m.decode_seconds == pytest.approx(m.total_seconds - m.time_to_first_token)
    latencies = token_latencies(trace.end_seconds, trace.kept)
    assert len(latencies) == len(result.tokens) - 1
    assert m.token_latency_p50 == percentile(latencies, 50) > 0
    assert m.token_latency_p50 <= m.token_latency_p90 <= m.token_latency_p99
    kind = CUDA_ALLOCATED if target.device.type == "cuda" else RSS_PEAK
    assert m.peak_memory_kind == kind and m.peak_memory_bytes > 0


def test_trace_off_keeps_tokens_and_latency_metrics():
    target = tiny_target("llama", vocab_size=64, spread=1.0, dtype=torch.float32)
    drafter = RandomTreeDrafter(target, gamma=3, nodes=8)
    on = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=20)
    off = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=20, trace=False)
    assert off.trace is None and on.trace is not None
    assert off.tokens == on.tokens == sf.generate(target, None, [1, 2, 3], max_new_tokens=20).tokens
    assert off.metrics.token_latency_p99 > 0 and off.metrics.peak_memory_bytes > 0


def test_plain_decoding_trace_is_all_target_tokens():
    target = tiny_target("gpt2", vocab_size=64, spread=1.0, dtype=torch.float32)
    result = sf.generate(target, None, [4, 5], max_new_tokens=6)
    assert result.trace.draft_tokens == [[]] * 6 and result.trace.bonus == result.tokens
    assert token_origins(result.trace) == [TARGET] * 6


def test_rss_peak_sees_memory_freed_before_it_is_read():
    if not PeakMemory.start("cpu").kind == RSS_PEAK:
        pytest.skip("the kernel offers no resettable RSS high-water mark (/proc/self/clear_refs)")
    size = 256 * 2**20
    base = PeakMemory.start("cpu").read()
    block = torch.ones(size // 4, dtype=torch.float32)  # touched: resident
    del block
    memory = PeakMemory.start("cpu")
    block = torch.ones(size // 4, dtype=torch.float32)
    del block
    assert memory.read() >= base + size * 0.9
    assert PeakMemory.start("cpu").read() < base + size * 0.5  # reset: the freed block no longer counts
