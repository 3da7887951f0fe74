import math

import torch

import specfamily as sf
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.drafters.medusa.typical import longest_passing_path, typical_accept, typical_pass
from specfamily.testing import tiny_target


def test_threshold_is_min_of_epsilon_and_delta_times_exp_minus_entropy():
    # row 0: p = (.5, .5): H = ln 2, delta * exp(-H) = .3 * .5 = .15 < epsilon = .2 -> threshold .15
    # row 1 (after node 0): p = (.9, .1): H = .325, .3 * exp(-H) = .217 > .2 -> threshold .2
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.12, 0.88]])
    tokens, parents = torch.tensor([0, 1]), torch.tensor([-1, 0])
    assert typical_pass(tokens, parents, p, epsilon=0.2, delta=0.3).tolist() == [True, False]
    entropy = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert 0.3 * math.exp(-entropy) > 0.2
    assert typical_pass(tokens, parents, p, epsilon=0.09, delta=0.3).tolist() == [True, True]


def test_longest_passing_path_prefers_depth_then_node_order():
    parents = [-1, -1, 0, 1, 3]
    assert longest_passing_path(parents, [True, True, True, True, True]) == [1, 3, 4]
    assert longest_passing_path(parents, [True, True, True, True, False]) == [0, 2]
    assert longest_passing_path(parents, [False, True, True, False, True]) == [1]
    assert longest_passing_path(parents, [False, False, True, True, True]) == []


def test_greedy_typical_acceptance_is_greedy_matching():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    path, token = typical_accept(torch.tensor([1, 2]), torch.tensor([-1, -1]), logits, sf.SamplingConfig(), None)
    assert (path, token) == ([0], 0)


def test_typical_option_marks_results_lossy():
    target = tiny_target("llama", vocab_size=32)
    drafter = sf.create_drafter("medusa", target, weights="random", typical=True)
    assert drafter.lossy
    result = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=8, sampling=sf.SamplingConfig(temperature=1.0))
    assert result.lossy and result.metrics.lossy
    assert not sf.generate(target, sf.create_drafter("medusa", target, weights="random"), [1, 2, 3],
                           max_new_tokens=8).lossy


def test_the_loop_accepts_with_the_typical_rule_only_when_asked(monkeypatch):
    target = tiny_target("llama", vocab_size=32, spread=1.0)
    plain = sf.generate(target, None, [1, 2, 3], max_new_tokens=20).tokens
    sampling = sf.SamplingConfig(temperature=1.0)
    for typical in (True, False):
        drafter = MedusaDrafter(target, weights="random", typical=typical, epsilon=0.05)
        calls = []
        rule = drafter.accept
        monkeypatch.setattr(drafter, "accept", lambda *args, rule=rule, calls=calls: calls.append(1) or rule(*args))
        greedy = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=20)
        assert greedy.tokens == plain  # at temperature 0 the typical rule is greedy matching
        sampled = sf.generate(target, drafter, [1, 2, 3], max_new_tokens=20, sampling=sampling)
        assert len(sampled.tokens) == 20 and sampled.lossy is typical
        passes = greedy.metrics.target_passes + sampled.metrics.target_passes
        assert len(calls) == (passes if typical else 0)
