import pytest
import torch

from specfamily.core.verify import DraftProbabilityError, greedy_tree, verify_chain, verify_tree

P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
Q = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)


def _one_hot(index: int, vocab: int = 5) -> torch.Tensor:
    row = torch.zeros(vocab, dtype=torch.float64)
    row[index] = 1.0
    return row


def test_textbook_single_position_law():
    """One drafted token x ~ q then the verifier: the output must follow p exactly."""
    gen = torch.Generator().manual_seed(0)
    n = 40000
    counts = torch.zeros(5)
    accepted = 0
    p_rows = torch.stack([P, P])  # row 1 (bonus) unused for the law of the first token
    for _ in range(n):
        x = torch.multinomial(Q, 1, generator=gen)
        k, nxt = verify_chain(x, Q.view(1, -1), p_rows, gen)
        first = int(x) if k == 1 else nxt
        counts[first] += 1
        accepted += k
    assert accepted / n == pytest.approx(0.67, abs=0.01)
    assert torch.allclose(counts / n, P.float(), atol=0.01)


def test_residual_after_rejection_is_norm_max_p_minus_q():
    gen = torch.Generator().manual_seed(1)
    residual = torch.clamp(P - Q, min=0)
    assert torch.allclose(residual, torch.tensor([0.22, 0, 0.06, 0.05, 0], dtype=torch.float64))
    # token 1 has p/q = .26/.45: rejections resample from the residual only
    counts = torch.zeros(5)
    for _ in range(20000):
        k, nxt = verify_chain(torch.tensor([1]), Q.view(1, -1), torch.stack([P, P]), gen)
        if k == 0:
            counts[nxt] += 1
    law = counts / counts.sum()
    assert torch.allclose(law, (residual / residual.sum()).float(), atol=0.015)
    assert counts[1] == 0 and counts[4] == 0


def test_greedy_chain_accepts_longest_matching_prefix():
    p = torch.stack([_one_hot(2), _one_hot(3), _one_hot(0), _one_hot(4)])
    assert verify_chain(torch.tensor([2, 3, 1]), None, p) == (2, 0)
    assert verify_chain(torch.tensor([2, 3, 0]), None, p) == (3, 4)
    assert verify_chain(torch.tensor([1, 3, 0]), None, p) == (0, 2)


def test_greedy_tree_matches_verify_tree_with_one_hot_p():
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)])
        tokens = torch.randint(0, 4, (n,), generator=gen)
        best = torch.randint(0, 4, (n + 1,), generator=gen)
        p = torch.nn.functional.one_hot(best, 5).double()
        path, nxt = verify_tree(tokens, parents, None, p, gen)
        # deterministic siblings with equal tokens: the first in index order wins in both
        assert greedy_tree(tokens, parents, best) == (path, nxt)


def test_tree_tries_children_in_order_and_descends():
    # root children: node 0 (token 1), node 1 (token 2); node 2 (token 3) is a child of node 1
    tokens, parents = torch.tensor([1, 2, 3]), torch.tensor([-1, -1, 1])
    p = torch.stack([_one_hot(2), _one_hot(0), _one_hot(3), _one_hot(4)])
    assert verify_tree(tokens, parents, None, p) == ([1, 2], 4)


def test_deterministic_tree_is_exact_under_sampling():
    """Two deterministic children at the root: the first token must still follow p."""
    gen = torch.Generator().manual_seed(2)
    tokens, parents = torch.tensor([1, 0]), torch.tensor([-1, -1])
    p = torch.stack([P, P, P])
    counts = torch.zeros(5)
    n = 30000
    for _ in range(n):
        path, nxt = verify_tree(tokens, parents, None, p, gen)
        counts[int(tokens[path[0]]) if path else nxt] += 1
    assert torch.allclose(counts / n, P.float(), atol=0.01)


def test_all_zero_residual_falls_back_to_the_current_residual(monkeypatch):
    """After rejecting sibling 0 the residual is one-hot at token 1; sibling 1's q exceeds it by one rounding step, so
    its rejection leaves max(r - q, 0) all zero. The guard must keep sampling from r (token 1), not from the root's
    p, which would bring the rejected token 0 back half of the time."""
    import specfamily.core.host as host
    import specfamily.core.verify as verify

    calls = []
    real_fallback = verify._all_zero_fallback

    def counting_fallback(current):
        calls.append(current.clone())
        return real_fallback(current)

    monkeypatch.setattr(verify, "_all_zero_fallback", counting_fallback)
    p = torch.stack([torch.tensor([0.5, 0.5, 0, 0, 0], dtype=torch.float64), P, P])
    q = torch.stack([_one_hot(0), _one_hot(1) * (1 + 2**-52)])  # q_1(1) = 1 + 2^-52 > r(1) = 1
    tokens, parents = torch.tensor([0, 1]), torch.tensor([-1, -1])
    draws = []
    for seed in range(40):
        # reject sibling 0 (0.9 >= 0.5), then sibling 1 (ratio 1 - 2^-52); then the final token's uniform, spread over
        # [0, 1): from the root's p, token 0 would come back for half of them
        uniforms = iter([0.9, 1 - 2**-53, seed / 40])
        monkeypatch.setattr(host, "uniform", lambda generator, device, scripted=uniforms: next(scripted))
        path, token = verify_tree(tokens, parents, q, p, torch.Generator().manual_seed(seed))
        assert path == []
        draws.append(token)
    assert len(calls) == 40  # the fallback branch ran every time
    assert torch.equal(calls[0], _one_hot(1))  # with the current residual
    assert draws == [1] * 40  # token 0 was rejected: never resampled


def test_fallback_is_not_taken_for_an_ordinary_rejection(monkeypatch):
    import specfamily.core.verify as verify

    monkeypatch.setattr(verify, "_all_zero_fallback", lambda current: pytest.fail("fallback taken"))
    for seed in range(50):
        verify_chain(torch.tensor([1]), Q.view(1, -1), torch.stack([P, P]), torch.Generator().manual_seed(seed))


def test_q_zero_for_the_drafted_token_is_an_error():
    q = _one_hot(0).view(1, -1)
    with pytest.raises(DraftProbabilityError, match="draft token 2 has q = 0"):
        verify_chain(torch.tensor([2]), q, torch.stack([P, P]))


def test_shape_errors():
    with pytest.raises(ValueError, match=r"p must have shape \(n \+ 1 = 3, V\)"):
        verify_tree(torch.tensor([1, 2]), torch.tensor([-1, 0]), None, torch.stack([P, P]))


@pytest.mark.parametrize(("row", "message"), [
    (torch.tensor([float("nan"), 0.45, 0.10, 0.05, 0.20], dtype=torch.float64),
     r"q of draft node 0 is not a distribution: 1 non-finite entries \(nan or inf\)"),
    (torch.tensor([0.20, float("inf"), 0.10, 0.05, 0.20], dtype=torch.float64),
     r"q of draft node 0 is not a distribution: 1 non-finite entries"),
    (Q / 2, r"q of draft node 0 is not a distribution: a sum of 0.5 \(more than 0.001 from 1\)"),
    (torch.tensor([0.30, 0.55, 0.10, 0.10, -0.05], dtype=torch.float64),
     r"q of draft node 0 is not a distribution: 1 negative entries \(the smallest -0.05\)"),
])
def test_a_q_that_is_not_a_distribution_is_refused(row, message):
    """Without the check a NaN at the drafted token accepts it always (min(1, p / nan) = 1), and a q summing to 0.5
    doubles every acceptance ratio: the verifier refuses the row, naming the node and what is wrong."""
    with pytest.raises(DraftProbabilityError, match=message):
        verify_chain(torch.tensor([0]), row.view(1, -1), torch.stack([P, P]), torch.Generator().manual_seed(0))


def test_the_bad_row_is_named_in_a_tree_and_healthy_rows_pass():
    q = torch.stack([Q, Q, Q * 0.9])
    with pytest.raises(DraftProbabilityError, match="q of draft node 2 is not a distribution: a sum of 0.9"):
        verify_tree(torch.tensor([1, 0, 2]), torch.tensor([-1, 0, -1]), q, torch.stack([P] * 4))
    verify_tree(torch.tensor([1, 0, 2]), torch.tensor([-1, 0, -1]), torch.stack([Q, Q, Q]), torch.stack([P] * 4))


def test_the_sum_tolerance_follows_the_reported_dtype():
    from specfamily.core.verify import sum_tolerance

    assert sum_tolerance(torch.float64) == sum_tolerance(torch.float32) == 1e-3
    assert sum_tolerance(torch.bfloat16) == pytest.approx(4 * 2**-7)
    bf16 = (Q * 1.02).to(torch.bfloat16)  # a bf16 softmax off by its rounding passes; float32 does not
    verify_chain(torch.tensor([1]), bf16.view(1, -1), torch.stack([P, P]).to(torch.bfloat16))
    with pytest.raises(DraftProbabilityError, match="a sum of 1.02"):
        verify_chain(torch.tensor([1]), (Q * 1.02).float().view(1, -1), torch.stack([P, P]).float())


def test_check_q_judges_rows_its_quick_pass_doubts_exactly():
    """The quick pass (float32 sum within tolerance / 2, no negative entry) only waves rows through; a row it doubts
    gets the exact float64 checks: within the tolerance it is accepted, beyond it refused with its sum."""
    from specfamily.core.verify import check_q, plain_rows

    row = torch.full((4,), 0.25)
    near, off = row * (1 + 0.8e-3), row * (1 + 1.2e-3)  # sums 1.0008 and 1.0012 against a tolerance of 1e-3
    assert plain_rows(torch.stack([row, near]), 1e-3).tolist() == [True, False]
    check_q(torch.stack([row, near]))
    with pytest.raises(DraftProbabilityError, match=r"^q of draft node 1 is not a distribution: a sum of 1\.0012"):
        check_q(torch.stack([row, off]))
    for bad in (float("nan"), float("inf"), -0.25):
        broken = row.clone()
        broken[1] = bad
        assert not plain_rows(broken.view(1, -1), 1e-3).any()
        with pytest.raises(DraftProbabilityError, match=r"^q of draft node 0 is not a distribution"):
            check_q(broken.view(1, -1))
