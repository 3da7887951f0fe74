"""host.draw: a drafter's next token by inversion of one uniform, on q's device, with no host read.

Law: chi-square of many draws against q, on rows with zero-mass tokens (leading, inner, trailing), a one-hot row
and a row of whole 64-token blocks (the CPU path's block skip), on the CPU path and on the device path's own
computation. Exactness: the device inversion is the host's (inverse_cdf) token for every u, and a stand-in device q
draws the same tokens from the same generator as the CPU q; a token without mass is never picked, even where the
cumulative sum rounds a zero's running sum up (as a parallel scan may). Cost: 0 host synchronisations on a stand-in
device q, where torch.multinomial(q, 1) makes 2.
"""

from __future__ import annotations

import pytest
import torch

from specfamily.core import host
from specfamily.testing.power import DEFAULT_SIGNIFICANCE
from specfamily.testing.stats import chi_square
from specfamily.testing.syncs import SyncCounter, on_device, on_host


def _rows() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    blocks = torch.zeros(256)
    blocks[[5, 70, 71, 200, 201, 202]] = torch.tensor([0.05, 0.3, 0.1, 0.25, 0.2, 0.1])
    return {
        "zeros": torch.tensor([0.0, 0.0, 0.30, 0.0, 0.15, 0.40, 0.0, 0.15, 0.0, 0.0]),
        "one-hot": torch.nn.functional.one_hot(torch.tensor(6), 9).float(),
        "blocks": blocks,
        "unnormalised": torch.rand(12, generator=gen) * (torch.rand(12, generator=gen) < 0.6) * 7.0,
    }


ROWS = _rows()


def _law(q: torch.Tensor) -> torch.Tensor:
    return q.double() / q.double().sum()


def _check_law(counts: torch.Tensor, q: torch.Tensor) -> None:
    law = _law(q)
    assert counts[law == 0].sum() == 0, counts  # no draw ever lands on a token without mass
    if int((law > 0).sum()) == 1:
        assert counts[law > 0].item() == counts.sum().item()  # a one-hot row: always its token
        return
    _, p_value, _ = chi_square(counts, law)
    assert p_value >= DEFAULT_SIGNIFICANCE, (counts, law)


@pytest.mark.parametrize("name", list(ROWS))
def test_the_cpu_draw_follows_q(name):
    q, gen, n = ROWS[name], torch.Generator().manual_seed(11), 20000
    counts = torch.zeros(q.numel(), dtype=torch.float64)
    for _ in range(n):
        token = host.draw(q, gen)
        assert token.shape == (1,) and token.dtype == torch.long
        counts[token] += 1
    _check_law(counts, q)


@pytest.mark.parametrize("name", list(ROWS))
def test_the_device_inversion_follows_q_with_a_uniform_per_draw(name):
    """The device path's computation (device_inverse_cdf; device-agnostic tensor code) on the host's tensors."""
    q, n = ROWS[name], 20000
    us = torch.rand(n, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    counts = torch.zeros(q.numel(), dtype=torch.float64)
    for u in us:
        counts[host.device_inverse_cdf(q, u)] += 1
    _check_law(counts, q)


@pytest.mark.parametrize("name", list(ROWS))
def test_the_device_inversion_is_the_hosts_for_every_u(name):
    q = ROWS[name]
    edges = [0.0, 1e-300, 0.5, 1.0 - 2**-53, 1.0]  # 1.0: u * total is the total itself, past every running sum
    us = edges + torch.rand(500, generator=torch.Generator().manual_seed(13), dtype=torch.float64).tolist()
    for u in us:
        expected = host.inverse_cdf(q, u)
        assert q[expected] > 0
        assert host.device_inverse_cdf(q, u).tolist() == [expected]
        assert host.device_inverse_cdf(q, torch.tensor(u, dtype=torch.float64)).tolist() == [expected]


def test_past_the_last_running_sum_the_last_token_with_mass_never_a_trailing_zero():
    q = torch.tensor([0.0, 0.25, 0.75, 0.0, 0.0])
    assert host.device_inverse_cdf(q, 1.0).tolist() == [2]
    assert host.inverse_cdf(q, 1.0) == 2
    assert host.device_inverse_cdf(q, 0.0).tolist() == [1]  # u = 0: the first token with mass, not a leading zero


def test_a_zero_whose_running_sum_rounds_up_is_never_drawn(monkeypatch):
    """A parallel scan may add a zero's running sum differently from its left neighbour's: here token 2 (q = 0) gets
    a running sum one ulp above token 1's, and a u * total between them must still draw token 3, the next with mass
    (searchsorted over the raw running sums would give token 2)."""
    q = torch.tensor([0.25, 0.25, 0.0, 0.5], dtype=torch.float64)
    scanned = torch.tensor(
        [0.25, 0.5, torch.nextafter(torch.tensor(0.5), torch.tensor(1.0)).item(), 1.0], dtype=torch.float64
    )
    real_cumsum = torch.Tensor.cumsum
    monkeypatch.setattr(
        torch.Tensor, "cumsum", lambda self, dim: scanned if self.shape == q.shape else real_cumsum(self, dim)
    )
    u = 0.5  # u * total = 0.5: at token 1's running sum (not above it), below token 2's rounded one
    assert int(torch.searchsorted(q.cumsum(0), torch.tensor([u]), right=True)) == 2  # the unguarded inversion
    assert host.device_inverse_cdf(q, u).tolist() == [3]


@pytest.mark.parametrize("name", list(ROWS))
def test_a_device_q_draws_what_the_cpu_q_draws_from_the_same_generator(name):
    """A stand-in device q with a host generator: its uniform is the host's next float64, so the same tokens and
    the same generator state as the CPU path (which inverts that uniform through inverse_cdf)."""
    q = ROWS[name]
    on_cpu, on_dev = torch.Generator().manual_seed(21), torch.Generator().manual_seed(21)
    for _ in range(100):
        expected = host.draw(q, on_cpu)
        got = host.draw(on_device(q), on_dev)
        assert got.device == torch.device("meta") and on_host(got).tolist() == expected.tolist()
    assert torch.equal(on_cpu.get_state(), on_dev.get_state())


def test_a_device_draw_makes_no_host_synchronisation():
    q, gen = on_device(ROWS["zeros"]), torch.Generator().manual_seed(4)
    with SyncCounter() as syncs:
        host.draw(q, gen)
    assert syncs.count == 0 and not syncs.queued, (syncs, syncs.queued)


def test_the_counter_has_power_multinomial_reads_q_twice():
    q, gen = on_device(ROWS["zeros"]), torch.Generator().manual_seed(4)
    with SyncCounter() as syncs:
        torch.multinomial(q, 1, generator=gen)
    assert [s.kind for s in syncs.syncs] == ["read inside an op"] * 2, syncs


@pytest.mark.parametrize(
    ("row", "total"),
    [([0.0, 0.0, 0.0, 0.0], "0.0"), ([0.5, float("nan"), 0.5, 0.0], "nan"), ([0.5, float("inf"), 0.0, 0.0], "inf")],
)
def test_a_cpu_draw_from_a_row_that_is_not_a_distribution_names_its_sum(row, total):
    # the whole-block path (256 = 4 blocks of 64, one live) and the plain path (4 tokens) say the same
    for q in (torch.tensor(row), torch.cat([torch.zeros(128), torch.tensor(row).repeat(16), torch.zeros(64)])):
        with pytest.raises(ValueError) as error:
            host.draw(q, torch.Generator().manual_seed(0))
        assert str(error.value) == f"cannot draw a token from a row whose sum is {total}: not a distribution"
