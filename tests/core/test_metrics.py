"""Metrics from a hand-made sequence of passes, and plain decoding's tau of exactly 1."""

import json
import math

import pytest

from specfamily.core.metrics import Metrics, MetricsRecorder, cost_ratio, per_position_acceptance


def speculative_recorder() -> MetricsRecorder:
    recorder = MetricsRecorder()
    recorder.record_pass(0, 0, draft_seconds=0.01, verify_seconds=0.5)  # prefill (+ drafter's prompt encoding)
    recorder.record_pass(4, 4, draft_seconds=0.04, verify_seconds=0.1)  # 5 new tokens
    recorder.record_pass(4, 1, draft_seconds=0.04, verify_seconds=0.1)  # 2
    recorder.record_pass(4, 0, draft_seconds=0.04, verify_seconds=0.1)  # 1
    recorder.record_pass(2, 2, draft_seconds=0.02, verify_seconds=0.1)  # 3
    return recorder


def test_hand_made_sequence_of_passes():
    metrics = speculative_recorder().finish(new_tokens=12, total_seconds=1.2)  # 1 + 5 + 2 + 1 + 3
    assert metrics.target_passes == 5
    assert metrics.new_tokens == 12
    assert metrics.mean_accepted_length == pytest.approx(12 / 5)
    assert metrics.draft_steps == 14
    assert metrics.proposed_tokens == 14
    assert metrics.accepted_tokens == 7
    assert metrics.acceptance_rate == pytest.approx(7 / 9)  # two proposals ended in a rejection
    assert metrics.draft_acceptance == pytest.approx(0.5)
    assert metrics.per_position_acceptance == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 3])
    assert metrics.draft_seconds == pytest.approx(0.15)
    assert metrics.verify_seconds == pytest.approx(0.9)
    assert metrics.other_seconds == pytest.approx(0.15)  # 1.2 - 0.15 - 0.9
    assert metrics.total_seconds == 1.2
    # prefill excluded: (0.14 s / 14 steps) / (0.4 s / 4 verification passes)
    assert metrics.c == pytest.approx(0.1)
    assert metrics.lossy is False


def test_other_seconds_and_lossy():
    metrics = speculative_recorder().finish(new_tokens=12, total_seconds=1.25, lossy=True)
    assert metrics.other_seconds == pytest.approx(0.2)
    clock_noise = speculative_recorder().finish(new_tokens=12, total_seconds=1.0499999)
    assert clock_noise.other_seconds == 0.0  # floored
    assert metrics.lossy is True


def test_running_c():
    recorder = MetricsRecorder()
    assert recorder.running_c() is None
    recorder.record_pass(0, 0, 0.0, 0.3)
    assert recorder.running_c() is None
    recorder.record_pass(3, 1, 0.03, 0.2)
    assert recorder.running_c() == pytest.approx(0.05)  # (0.03 / 3) / 0.2
    recorder.record_pass(3, 3, 0.06, 0.2)
    assert recorder.running_c() == pytest.approx(0.075)  # (0.09 / 6) / 0.2


def test_c_leaves_out_the_prefill_pass_even_with_a_proposal():
    recorder = MetricsRecorder()
    recorder.record_pass(3, 1, draft_seconds=0.03, verify_seconds=2.0)  # prefill of a long prompt
    assert recorder.running_c() is None
    recorder.record_pass(3, 3, draft_seconds=0.03, verify_seconds=0.1)
    assert recorder.running_c() == pytest.approx(0.1)  # (0.03 / 3) / 0.1
    metrics = recorder.finish(new_tokens=2 + 4, total_seconds=2.2)
    assert metrics.c == pytest.approx(0.1)
    assert metrics.draft_steps == 6 and metrics.accepted_tokens == 4
    assert metrics.acceptance_rate == pytest.approx(4 / 5)
    assert metrics.per_position_acceptance == pytest.approx([1.0, 0.5, 0.5])
    assert metrics.mean_accepted_length == pytest.approx(3.0)


def test_tree_drafter_reports_its_own_counts():
    recorder = MetricsRecorder()
    recorder.record_pass(0, 0, 0.0, 0.1)
    recorder.record_pass(3, 2, 0.02, 0.1, draft_steps=1, proposed_tokens=10)  # a depth-3 tree of 10 nodes
    recorder.record_pass(3, 3, 0.02, 0.1, draft_steps=1, proposed_tokens=10)
    metrics = recorder.finish(new_tokens=1 + 3 + 4, total_seconds=0.4)
    assert metrics.draft_steps == 2
    assert metrics.proposed_tokens == 20
    assert metrics.accepted_tokens == 5
    assert metrics.acceptance_rate == pytest.approx(5 / 6)
    assert metrics.draft_acceptance == pytest.approx(0.25)
    assert metrics.per_position_acceptance == pytest.approx([1.0, 1.0, 0.5])
    assert metrics.mean_accepted_length == pytest.approx(8 / 3)
    assert metrics.c == pytest.approx(0.2)  # (0.04 / 2) / (0.2 / 2)


def test_plain_decoding_has_tau_one():
    recorder = MetricsRecorder()
    for _ in range(10):
        recorder.record_pass(0, 0, draft_seconds=0.0, verify_seconds=0.01)
    metrics = recorder.finish(new_tokens=10, total_seconds=0.2)
    assert metrics.mean_accepted_length == 1.0
    assert metrics.target_passes == 10
    assert metrics.draft_steps == metrics.proposed_tokens == metrics.accepted_tokens == 0
    assert math.isnan(metrics.acceptance_rate) and math.isnan(metrics.draft_acceptance) and math.isnan(metrics.c)
    assert metrics.per_position_acceptance == []
    assert metrics.other_seconds == pytest.approx(0.1)
    assert recorder.running_c() is None


def test_as_dict_is_flat_and_json_friendly():
    row = MetricsRecorder().finish(new_tokens=0, total_seconds=0.0).as_dict()
    assert set(row) == {field for field in Metrics.__dataclass_fields__}
    assert row["acceptance_rate"] is None and row["c"] is None and row["mean_accepted_length"] is None
    json.dumps(row, allow_nan=False)
    row = speculative_recorder().finish(new_tokens=12, total_seconds=1.0).as_dict()
    assert row["per_position_acceptance"] == pytest.approx([0.75, 0.5, 1 / 3, 1 / 3])
    assert json.loads(json.dumps(row, allow_nan=False))["target_passes"] == 5


def test_pure_helpers():
    assert cost_ratio(0.1, 10, 1.0, 5) == pytest.approx(0.05)
    assert math.isnan(cost_ratio(0.1, 0, 1.0, 5))
    assert math.isnan(cost_ratio(0.1, 10, 0.0, 5))
    assert per_position_acceptance([4, 2], [3, 0]) == [0.75, 0.0]


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((2, 3, 0.0, 0.1), {}),
        ((-1, 0, 0.0, 0.1), {}),
        ((2, 1, -0.1, 0.1), {}),
        ((2, 1, 0.0, math.nan), {}),
        ((2, 1, 0.0, 0.1), {"draft_steps": -1}),
        ((3, 1, 0.0, 0.1), {"proposed_tokens": 2}),
        ((2.5, 1, 0.0, 0.1), {}),
    ],
)
def test_bad_passes_are_value_errors(args, kwargs):
    with pytest.raises(ValueError):
        MetricsRecorder().record_pass(*args, **kwargs)


def test_bad_finish_is_a_value_error():
    with pytest.raises(ValueError, match="new_tokens"):
        MetricsRecorder().finish(new_tokens=-1, total_seconds=0.0)
    with pytest.raises(ValueError, match="total_seconds"):
        MetricsRecorder().finish(new_tokens=0, total_seconds=-1.0)


def test_a_path_accepted_down_to_a_shallow_leaf_is_not_a_rejection():
    """A depth-3 tree whose accepted path ends at a leaf of depth 2: the verifier tried nothing deeper, so the pass
    rejected nothing and depth 3 was never tried (counting it as proposed-not-accepted biased alpha low)."""
    recorder = MetricsRecorder()
    recorder.record_pass(0, 0, 0.0, 0.1)
    recorder.record_pass(3, 2, 0.02, 0.1, draft_steps=1, proposed_tokens=6, verified_depth=2)  # leaf at depth 2
    recorder.record_pass(3, 1, 0.02, 0.1, draft_steps=1, proposed_tokens=6, verified_depth=2)  # rejected at depth 2
    recorder.record_pass(3, 3, 0.02, 0.1, draft_steps=1, proposed_tokens=6, verified_depth=3)
    metrics = recorder.finish(new_tokens=1 + 3 + 2 + 4, total_seconds=0.5)
    assert metrics.acceptance_rate == pytest.approx(6 / 7)  # one rejection (the second pass), not two
    assert metrics.per_position_acceptance == pytest.approx([1.0, 2 / 3, 1 / 2])  # cumulative: P(accepted > i)
    assert metrics.conditional_acceptance == pytest.approx([1.0, 2 / 3, 1.0])  # depth 3 tried once, accepted once


def test_a_chain_counts_as_before_and_verified_depth_is_checked():
    chain = speculative_recorder().finish(new_tokens=12, total_seconds=1.2)
    assert chain.conditional_acceptance == pytest.approx([3 / 4, 2 / 3, 1 / 1, 1 / 1])
    with pytest.raises(ValueError, match=r"verified_depth \(1\) must lie between accepted \(2\) and proposed_depth"):
        MetricsRecorder().record_pass(3, 2, 0.0, 0.1, verified_depth=1)


def test_the_loop_counts_what_the_verifier_tried_on_a_tree():
    """Greedy on a tree whose first child (the target's own next token) is a leaf and whose second starts a chain
    of 3: every pass accepts the leaf, so nothing was rejected and only depth 1 was tried."""
    import specfamily as sf
    from specfamily.core.types import Draft
    from specfamily.testing import OracleDrafter, tiny_target

    class LeafFirst(OracleDrafter):
        def propose(self, ctx, gamma):
            right = self.continuation[len(ctx.tokens)]
            wrong = (right + 1) % ctx.target.vocab_size
            return Draft([right, wrong, wrong, wrong], [-1, -1, 1, 2])

    target = tiny_target("llama")
    metrics = sf.generate(target, LeafFirst(target, gamma=3), [1, 2, 3], max_new_tokens=9).metrics
    assert metrics.acceptance_rate == 1.0 and metrics.conditional_acceptance == [1.0]
    assert metrics.per_position_acceptance == [1.0]


def test_the_prefill_and_the_drafted_passes_are_timed_apart():
    recorder = speculative_recorder()
    recorder.record_pass(0, 0, draft_seconds=0.0, verify_seconds=0.08)  # a pass that drafted nothing
    metrics = recorder.finish(new_tokens=13, total_seconds=1.3)
    assert metrics.prefill_seconds == 0.5
    assert metrics.drafted_passes == 4  # the prefill and the undrafted pass left out
    assert metrics.drafted_verify_seconds == pytest.approx(0.4)
    assert math.isnan(MetricsRecorder().finish(new_tokens=0, total_seconds=0.0).prefill_seconds)
