import torch

import specfamily as sf
from specfamily.core.typical import longest_passing_path, typical_accept, typical_pass
from specfamily.drafters.medusa.drafter import MedusaDrafter
from specfamily.testing import tiny_target


def test_threshold_is_min_of_epsilon_and_delta_times_exp_minus_entropy():
    # row 0: p = (.18, .82), H = .471, exp(-H) = .624; row 1 (after node 0): p = (.9, .1), H = .325, exp(-H) = .723
    p = torch.tensor([[0.18, 0.82], [0.9, 0.1], [0.5, 0.5]])
    tokens, parents = torch.tensor([0, 1]), torch.tensor([-1, 0])
    # delta .25, epsilon .2: the entropy term binds in both rows (.156 and .181): .18 clears .156 though it is
    # below epsilon; .1 fails .181
    assert typical_pass(tokens, parents, p, epsilon=0.2, delta=0.25).tolist() == [True, False]
    # epsilon .09 binds in both rows: .1 clears it though it is below delta * exp(-H)
    assert typical_pass(tokens, parents, p, epsilon=0.09, delta=0.25).tolist() == [True, True]
    # delta .35: the entropy terms (.218, .253) exceed epsilon .2, which binds: .18 fails it
    assert typical_pass(tokens, parents, p, epsilon=0.2, delta=0.35).tolist() == [False, False]
    # the threshold is strict: p(x) equal to it does not pass
    assert typical_pass(torch.tensor([1]), torch.tensor([-1]), p[2:], epsilon=0.5, delta=2.0).tolist() == [False]


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
