import pytest
import torch

import specfamily as sf
from specfamily.core.policy import ConstantPolicy
from specfamily.core.types import Draft, SamplingConfig
from specfamily.testing import (
    SAMPLING_MATRIX,
    ConformanceError,
    ConformanceWarning,
    DepthRecorder,
    RandomTreeDrafter,
    WrongDrafter,
    assert_greedy_equivalent,
    assert_lossless,
    detection_power,
    exact_distribution,
    power,
    samples_for_power,
    tiny_target,
)
from specfamily.testing.conformance import PROMPT, chi_square, sample_sequences
from specfamily.testing.depth import DepthStats, path_from_tokens
from specfamily.testing.power import (
    depth_samples,
    diluted_power,
    level_power,
    run_samples,
    share_for_power,
    share_lower_bound,
)
from specfamily.testing.rogues import LateMisreport
from specfamily.testing.sampling_run import sample_run
from specfamily.testing.stats import marginal_law, sequence_index, sequence_tests


def test_exact_distribution_sums_to_one_and_matches_chain_rule():
    target = tiny_target("llama")
    sampling = SamplingConfig(temperature=1.0)
    probs = exact_distribution(target, [1, 2, 3], 2, sampling)
    assert probs.sum().item() == pytest.approx(1.0)
    first = torch.softmax(target.model(torch.tensor([[1, 2, 3]])).logits[0, -1].float(), -1).double()
    assert torch.allclose(probs.view(8, 8).sum(1), first, atol=1e-6)


def test_chi_square_pools_small_cells():
    probs = torch.tensor([0.5, 0.3, 0.199, 0.001], dtype=torch.float64)
    _, p_value, cells = chi_square(torch.tensor([500.0, 300.0, 199.0, 1.0]), probs)
    assert cells == 3 and p_value > 0.9  # the 0.001 cell joins the next smallest
    _, p_value, _ = chi_square(torch.tensor([700.0, 200.0, 99.0, 1.0]), probs)
    assert p_value < 1e-6


def test_too_few_samples_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="3 samples are too few for a chi-square test"):
        chi_square(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64))


def test_small_cells_are_pooled_into_several_buckets():
    probs = torch.full((100,), 0.01, dtype=torch.float64)
    _, _, cells = chi_square(torch.full((100,), 10.0), probs)
    assert cells == 100
    _, _, cells = chi_square(torch.full((100,), 2.0), probs)  # expected 2 per cell: buckets of 3 cells
    assert cells == 33


def test_suite_rejects_the_wrong_drafter():
    with pytest.raises(ConformanceError, match="not lossless under"):
        assert_lossless(lambda target: WrongDrafter(target), configs=SAMPLING_MATRIX[:1])


def test_plain_decoding_is_lossless():
    assert_lossless(lambda target: None, configs=SAMPLING_MATRIX[1:2])


def test_deterministic_random_tree_is_lossless():
    [fit] = assert_lossless(lambda target: RandomTreeDrafter(target, nodes=6), configs=SAMPLING_MATRIX[2:3],
                            min_depth=1)  # 6 random nodes: depth 2 in ~40% of samples
    assert fit.depth.trees > 0


def test_sampled_random_tree_is_lossless():
    [fit] = assert_lossless(lambda target: RandomTreeDrafter(target, nodes=6, sampled=True),
                            configs=SAMPLING_MATRIX[:1], min_depth=2)
    assert fit.depth.trees > 0


def test_random_tree_is_greedy_equivalent():
    assert_greedy_equivalent(lambda target: RandomTreeDrafter(target, nodes=8))


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_random_tree_full_matrix(sampled, family):
    assert_lossless(lambda target: RandomTreeDrafter(target, sampled=sampled), family=family)


# ---------------------------------------------------------------- sample sizes


def test_power_calculation_numbers():
    """The suite's default: a TV deviation of 0.1 at one position caught with power 0.99 at 1e-3 / 10 (V = 8)."""
    assert run_samples(8, 5) == samples_for_power(0.1, 8, 1e-4, 0.99) == 1339
    assert detection_power(1339, 0.1, 8, 1e-4) >= 0.99 > detection_power(1338, 0.1, 8, 1e-4)
    assert samples_for_power(0.05, 8, 1e-4) == 5355  # half the deviation: four times the samples
    assert detection_power(1000, 0.1, 8, 1e-4) == pytest.approx(0.915, abs=1e-3)


def test_power_against_an_error_only_at_one_depth_falls_with_the_share_that_reaches_it():
    """A conditional TV of 0.1 at a depth reached by a share f of the samples shows as about f * 0.1 at its position:
    at the default 1339 samples the power is 0.99 at f = 1 and 0.13 at f = 0.5; f = 0.5 needs 3883 samples."""
    level = 1e-4
    assert detection_power(1339, 0.5 * 0.1, 8, level) == pytest.approx(0.128, abs=2e-3)
    assert depth_samples(0.5, 0.1, 8, level) == samples_for_power(0.05, 8, level, 0.9) == 3883
    assert depth_samples(1.0, 0.1, 8, level) == 971  # power 0.9 (the depth default), not the marginals' 0.99
    share = share_for_power(1339, 0.1, 8, level)
    assert detection_power(1339, share * 0.1, 8, level) == pytest.approx(0.9, abs=1e-6) and share == pytest.approx(
        0.851, abs=1e-3)
    with pytest.raises(ValueError, match="no sample count has power at a depth reached by a share 0"):
        depth_samples(0.0, 0.1, 8, level)


def test_an_error_only_at_depth_three_splits_over_two_positions_and_the_level_test_pools_them():
    """A chain drafted from the first pass lands its depth-3 node at position 3, or at position 4 after a first pass
    that accepted nothing. The old sizing counted the share f of requests that verified depth 3 and claimed power
    detection_power(N, f * 0.1); each position's marginal carries only its own share of the error, so that claim
    overstated what the marginals had. The level-3 test pools the depth-3 decisions of both positions, each against
    its own prefix's p: its power comes from their count, and the kit sized by it rejects the rogue there."""
    target, sampling = tiny_target("llama"), SAMPLING_MATRIX[0]

    def rogue(t):
        return LateMisreport(t, noise=1.5)

    run = sample_run(target, rogue(target), PROMPT, 5, sampling, 400, gamma=3, first_seed=50_000)
    shares = (run.levels == 3).double().mean(dim=0).tolist()  # per position: samples deciding it at depth 3
    share = run.depth.share_verified(3)  # per request, as the old sizing counted it
    assert shares[2] > 0.1 and shares[3] > 0.1 and shares[0] == shares[1] == shares[4] == 0
    assert share > 1.2 * max(shares)
    alpha = 1e-3 / power.tests_per_run(5)
    old = depth_samples(share, 0.1, 8, alpha)  # the old sizing: enough for power 0.9 at the request share
    claimed = diluted_power(old, share, 0.1, 8, alpha)
    marginals = max(diluted_power(old, position, 0.1, 8, alpha) for position in shares)
    assert claimed >= 0.9 and marginals < 0.75, (claimed, marginals)
    assert level_power(round(old * sum(shares)), 0.1, 8, alpha) > claimed  # the same samples, pooled by level
    with pytest.raises(ConformanceError, match="not lossless under") as info:
        assert_lossless(rogue, configs=[sampling])
    fit = info.value.fit  # rejected by its level-3 tokens, at the first look or with power 0.9 there
    assert fit.worst.name.startswith("level 3") and (fit.look == (1, 2) or fit.depth_power >= 0.9), fit.describe()


def test_the_pilot_share_is_taken_at_its_lower_bound():
    assert share_lower_bound(0.5, 200) == pytest.approx(0.430, abs=1e-3)  # Wilson, two standard errors
    assert share_lower_bound(1.0, 200) < 1.0 and share_lower_bound(0.0, 200) == 0.0
    assert share_lower_bound(0.5, 20000) == pytest.approx(0.493, abs=1e-3)


def test_depth_stats_count_requests_that_reached_each_depth():
    stats = DepthStats()
    stats.begin_request()
    stats.add(3, 1, 0)  # a pass verified to depth 1, then one to depth 3 in the same request: counted once
    stats.add(3, 3, 2)
    stats.begin_request()
    stats.add(2, 2, 2)
    stats.begin_request()
    assert stats.requests_verified == [2, 2, 1]
    assert [stats.share_verified(d) for d in (1, 2, 3, 4)] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 0])


def test_the_kit_drives_the_drafter_at_its_own_length_whatever_the_policy():
    """A cost-aware drafter told by its policy to draft nothing is driven at gamma 3 by the kit."""

    class Idle(RandomTreeDrafter):
        def __init__(self, target):
            super().__init__(target, nodes=6, sampled=True)
            self.policy = ConstantPolicy(1)
            self.asked = []

        def propose(self, ctx, gamma):
            self.asked.append(gamma)
            return super().propose(ctx, gamma)

    target = tiny_target("llama")
    drafter = Idle(target)
    _, stats = sample_sequences(target, drafter, PROMPT, 5, SAMPLING_MATRIX[0], 20, gamma=3)
    assert set(drafter.asked) <= {3, 2, 1} and drafter.asked.count(3) >= 20  # the loop caps at the budget's end
    _, own = sample_sequences(target, drafter, PROMPT, 5, SAMPLING_MATRIX[0], 5, gamma=None)
    assert set(drafter.asked[-own.passes:]) == {1}


def test_power_bound_holds_empirically():
    """Simulated: a law at TV 0.1 from p, 1339 samples, 8 cells: rejected at 1e-4 in >= 99% of 300 trials."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02], dtype=torch.float64)
    moved = p.clone()
    moved[0] -= 0.1
    moved[6] += 0.1  # total variation 0.1
    rejected = 0
    for _ in range(300):
        counts = torch.bincount(torch.multinomial(moved, 1339, replacement=True, generator=gen), minlength=8)
        rejected += chi_square(counts.double(), p)[1] < 1e-4
    assert rejected >= 297


def test_bad_power_arguments():
    with pytest.raises(ValueError, match="need 0 < delta <= 1"):
        samples_for_power(0.0, 8, 1e-4)


# ---------------------------------------------------------------- marginals, pairs, joint


def test_marginals_and_pairs_come_from_the_joint():
    joint = torch.rand(8**3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    joint /= joint.sum()
    table = joint.view(8, 8, 8)
    assert torch.allclose(marginal_law(joint, 8, 3, (1,)), table.sum(dim=(0, 2)))
    assert torch.allclose(marginal_law(joint, 8, 3, (1, 2)), table.sum(dim=0).reshape(-1))
    assert sequence_index(torch.tensor([[1, 2, 3]]), 8).item() == 1 * 64 + 2 * 8 + 3


def test_a_late_position_error_is_seen_by_its_marginal_not_by_the_joint():
    """Position 3 of 3 drawn from a law at TV 0.05: its marginal rejects, the joint (512 cells) does not."""
    gen = torch.Generator().manual_seed(1)
    first = torch.softmax(torch.randn(64, generator=gen, dtype=torch.float64), 0)
    third = torch.softmax(torch.randn(8, generator=gen, dtype=torch.float64), 0)
    joint = (first[:, None] * third[None, :]).reshape(-1)
    moved = third.clone()
    moved[third.argmax()] -= 0.05
    moved[third.argmin()] += 0.05
    heads = torch.multinomial(first, 1339, replacement=True, generator=gen)
    tails = torch.multinomial(moved, 1339, replacement=True, generator=gen)
    sequences = torch.stack([heads // 8, heads % 8, tails], dim=1)
    tests = {test.name: test.p_value for test in sequence_tests(sequences, joint, 8)}
    assert list(tests) == ["position 1", "position 2", "position 3", "pair 1-2", "pair 2-3", "joint"]
    assert tests["position 3"] < 1e-20 and tests["joint"] > 1e-3


# ---------------------------------------------------------------- depth reached


def test_path_from_committed_tokens():
    draft = Draft([4, 5, 6, 7, 5], [-1, -1, 0, 1, 3])
    assert path_from_tokens(draft, [5, 7, 5, 2]) == [1, 3, 4]
    assert path_from_tokens(draft, [4, 1]) == [0]
    assert path_from_tokens(draft, [3]) == []
    assert draft.verified_depth([1, 3, 4]) == 3  # node 4 has no children
    assert draft.verified_depth([0]) == 2  # node 0's child 2 was tried
    assert draft.verified_depth([]) == 1


def test_depth_recorder_agrees_with_the_loops_acceptance_counts():
    target = tiny_target("llama")
    inner = RandomTreeDrafter(target, nodes=6, sampled=True)
    recorder = DepthRecorder(inner)
    accepted = 0
    for seed in range(30):
        result = sf.generate(target, recorder, [1, 2, 3], max_new_tokens=8, sampling=SAMPLING_MATRIX[0], seed=seed)
        accepted += result.metrics.accepted_tokens
    stats = recorder.stats
    assert sum(stats.accepted) == accepted  # the last, unobserved pass of each request counted too
    assert stats.deepest_verified <= stats.deepest_drafted <= 3 and stats.passes > 30
    assert recorder.policy is inner.policy and recorder.needs_features is False


def test_a_run_that_does_not_reach_the_required_depth_passes_with_a_warning_or_fails_on_request():
    """An honest drafter whose drafts seldom get 3 deep passes, with a ConformanceWarning that says what was not
    tested; require_depth=True turns it into a failure."""
    shallow = (r"depth 1, 2, 3 not tested to power 0\.9: \d+ tokens of 200 samples were decided at level 3 "
               r"\(power 0\.\d\d against an error of total variation 0\.1 there\).*What was tested: tiny llama "
               r"target \(vocabulary 8, no EOS, seed 0\), prompt \(1, 2, 3\), 5 new tokens, gamma 3")
    factory = lambda target: RandomTreeDrafter(target, gamma=1, nodes=3)  # noqa: E731
    with pytest.warns(ConformanceWarning, match=shallow):
        [fit] = assert_lossless(factory, configs=SAMPLING_MATRIX[:1], samples=200, min_depth=3)
    assert fit.untested_depths == [1, 2, 3] and fit.level_tokens[3] < 200
    with pytest.raises(ConformanceError, match=shallow):
        assert_lossless(factory, configs=SAMPLING_MATRIX[:1], samples=200, min_depth=3, require_depth=True)


class _ZeroQ(RandomTreeDrafter):
    """Proposes token 0 while reporting a q that rules it out."""

    def propose(self, ctx, gamma):
        return Draft.chain([0], torch.tensor([[0.0] + [1 / 7] * 7], dtype=torch.float64))


def test_a_token_the_reported_q_rules_out_is_a_conformance_failure():
    with pytest.raises(ConformanceError, match="draft token 0 has q = 0") as info:
        assert_lossless(_ZeroQ, configs=SAMPLING_MATRIX[:1], samples=10)
    assert info.value.fit is None
