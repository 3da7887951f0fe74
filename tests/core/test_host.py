"""The sampled-tree verifier moves what it needs to the host once per pass, with the old path's math and randomness.

``_old_verify_tree`` is the verifier as it was (an ``.item()`` per tried node, draws on the residual's device; its
final token drawn by inversion of one uniform, as the verifier now draws it, where it was ``torch.multinomial``): on
CPU tensors with a CPU generator the new one must give the same paths, tokens and generator state on many random
trees. ``DeviceTensor`` stands in for tensors on an accelerator and counts what would be a device-to-host transfer.
"""

from __future__ import annotations

import pytest
import torch

import specfamily.core.host as host
from specfamily.core.host import to_host
from specfamily.core.verify import greedy_tree, verify_tree
from specfamily.testing.syncs import STAND_IN, SyncCounter, on_device, on_host

P = torch.tensor([0.42, 0.26, 0.16, 0.10, 0.06], dtype=torch.float64)
Q = torch.tensor([0.20, 0.45, 0.10, 0.05, 0.20], dtype=torch.float64)


def _old_verify_tree(tokens, parents, q, p, generator=None, draw_on=None):
    """The verifier before the host walk, verbatim in its math and its draws (``draw_on``: override the device of
    the draws, which was the residual's)."""

    def uniform(device):
        return torch.rand((), generator=generator, device=draw_on or device, dtype=torch.float64).item()

    p64, q64 = p.double(), None if q is None else q.double()
    token_list, children = tokens.tolist(), {}
    for node, parent in enumerate(parents.tolist()):
        children.setdefault(parent, []).append(node)
    path, node, residual = [], -1, p64[0]
    while True:
        accepted = None
        for child in children.get(node, []):
            token = token_list[child]
            if q64 is None:
                if uniform(residual.device) < residual[token].item():
                    accepted = child
                    break
                rejected = residual.clone()
                rejected[token] = 0.0
            else:
                if uniform(residual.device) < min(1.0, residual[token].item() / q64[child][token].item()):
                    accepted = child
                    break
                rejected = torch.clamp(residual - q64[child], min=0.0)
            total = rejected.sum()
            residual = residual / residual.sum() if total <= 0 else rejected / total
        if accepted is None:  # the final token by inversion of one more uniform (it was torch.multinomial)
            return path, host.inverse_cdf(residual, uniform(residual.device))
        path.append(accepted)
        node, residual = accepted, p64[accepted + 1]


def _random_case(gen: torch.Generator, sampled: bool, dtype=torch.float32):
    """A random tree (1-10 nodes) over a random vocabulary, with p rows that have zeros (top-k style) and, when
    ``sampled``, tokens actually drawn from their q rows."""
    n = int(torch.randint(1, 11, (1,), generator=gen))
    vocab = int(torch.randint(2, 13, (1,), generator=gen))
    parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)])
    p = torch.rand(n + 1, vocab, generator=gen) ** 3
    p[torch.rand(n + 1, vocab, generator=gen) < 0.3] = 0.0
    p[:, 0] += 0.01  # every row keeps some mass
    p = (p / p.sum(dim=1, keepdim=True)).to(dtype)
    if not sampled:
        return torch.randint(0, vocab, (n,), generator=gen), parents, None, p
    q = torch.softmax(2 * torch.randn(n, vocab, generator=gen), dim=-1).to(dtype)
    tokens = torch.multinomial(q.double(), 1, generator=gen).view(-1)
    return tokens, parents, q, p


@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_same_paths_tokens_and_generator_state_as_the_old_path(sampled):
    cases = torch.Generator().manual_seed(11 + sampled)
    for seed in range(400):
        tokens, parents, q, p = _random_case(cases, sampled)
        old_gen, new_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(3):  # consecutive passes on one generator: the stream must stay in step
            assert verify_tree(tokens, parents, q, p, new_gen) == _old_verify_tree(tokens, parents, q, p, old_gen)
        assert torch.equal(old_gen.get_state(), new_gen.get_state())


def test_same_draws_from_the_global_generator_without_one():
    tokens, parents, q, p = _random_case(torch.Generator().manual_seed(3), sampled=True)
    torch.manual_seed(5)
    old = [_old_verify_tree(tokens, parents, q, p) for _ in range(20)]
    torch.manual_seed(5)
    assert [verify_tree(tokens, parents, q, p) for _ in range(20)] == old


class DeviceTensor(torch.Tensor):
    """A CPU tensor that reports a CUDA device and counts what would copy it to the host: a copy into a host tensor
    is counted as "copy" when the host waits for it, "queued copy" when it is queued (``non_blocking``)."""

    transfers: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch._C.TensorBase.device:
            return torch.device("cuda", 0)
        name = getattr(func, "__name__", "")
        if name == "copy_":
            queued = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            cls.transfers.append("queued copy" if queued else "copy")
        elif name in ("cpu", "item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__") or (
            name == "to" and "cpu" in map(str, (*args[1:], *kwargs.values()))
        ):
            cls.transfers.append(name)
            if name == "cpu":
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs).as_subclass(torch.Tensor)
        return super().__torch_function__(func, types, args, kwargs)


def _waits() -> list[str]:
    """The transfers the host waited for."""
    return [name for name in DeviceTensor.transfers if name != "queued copy"]


def _on_device(tensor):
    return None if tensor is None else tensor.as_subclass(DeviceTensor)


@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_one_device_to_host_copy_per_pass(sampled):
    cases = torch.Generator().manual_seed(7)
    for seed in range(100):
        tokens, parents, q, p = _random_case(cases, sampled, dtype=torch.bfloat16 if seed % 2 else torch.float32)
        expected = verify_tree(tokens, parents, q, p, torch.Generator().manual_seed(seed))
        DeviceTensor.transfers = []
        gen = torch.Generator().manual_seed(seed)
        got = verify_tree(_on_device(tokens), parents, _on_device(q), _on_device(p), gen)
        assert _waits() == ["copy"], DeviceTensor.transfers
        assert got == expected


def test_greedy_tree_copies_once():
    tokens, parents = torch.tensor([1, 2, 3]), torch.tensor([-1, -1, 1])
    best = torch.tensor([2, 0, 3, 4])
    DeviceTensor.transfers = []
    assert greedy_tree(_on_device(tokens), parents, _on_device(best)) == ([1, 2], 4)
    assert DeviceTensor.transfers == ["queued copy", "copy"]  # parents live on the host


def test_the_counter_sees_per_node_reads():
    """The counter has power: the old path on 'device' tensors reads scalars node by node."""
    tokens, parents, q, p = _random_case(torch.Generator().manual_seed(1), sampled=True)
    DeviceTensor.transfers = []
    _old_verify_tree(_on_device(tokens), parents, _on_device(q), _on_device(p), torch.Generator(), draw_on="cpu")
    assert DeviceTensor.transfers.count("item") >= 2 and "tolist" in DeviceTensor.transfers


def test_to_host_keeps_dtypes_values_and_shapes():
    tensors = [torch.arange(5), None, torch.rand(3, 7, dtype=torch.bfloat16), torch.rand(2, 3).double(),
               torch.tensor(True), torch.zeros(0, 4)]
    DeviceTensor.transfers = []
    host = to_host([_on_device(t) for t in tensors])
    assert DeviceTensor.transfers == ["queued copy"] * 3 + ["copy"]  # the empty tensor needs no copy
    for before, after in zip(tensors, host, strict=True):
        if before is None:
            assert after is None
            continue
        assert type(after) is torch.Tensor and after.dtype == before.dtype and after.shape == before.shape
        assert torch.equal(after, before)


def _block_draws_from(monkeypatch, gen: torch.Generator) -> None:
    """Make verify_tree draw as on an accelerator (a block of uniforms per pass) with CPU draws; the tests then ask
    for the host walk (``device_walk=False``); tests/core/test_device_verify.py tests the device walk."""
    monkeypatch.setattr(host, "draw_device", lambda p, generator: torch.device("cuda", 0))
    monkeypatch.setattr(host, "uniform_block",
                        lambda size, generator, device: torch.rand(size, generator=gen, dtype=torch.float64))


def test_block_draws_keep_the_textbook_law(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    _block_draws_from(monkeypatch, gen)
    n, counts, accepted = 40000, torch.zeros(5), 0
    for _ in range(n):
        x = torch.multinomial(Q, 1, generator=gen)
        path, nxt = verify_tree(x, torch.tensor([-1]), Q.view(1, -1), torch.stack([P, P]), gen, device_walk=False)
        counts[int(x) if path else nxt] += 1
        k = len(path)
        accepted += k
    assert accepted / n == pytest.approx(0.67, abs=0.01)
    assert torch.allclose(counts / n, P.float(), atol=0.01)


def test_block_draws_keep_a_deterministic_trees_law(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    _block_draws_from(monkeypatch, gen)
    tokens, parents, p = torch.tensor([1, 0]), torch.tensor([-1, -1]), torch.stack([P, P, P])
    counts, n = torch.zeros(5), 30000
    for _ in range(n):
        path, nxt = verify_tree(tokens, parents, None, p, gen, device_walk=False)
        counts[int(tokens[path[0]]) if path else nxt] += 1
    assert torch.allclose(counts / n, P.float(), atol=0.01)


def test_inverse_cdf_never_picks_a_token_without_mass():
    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0], dtype=torch.float64)
    assert host.inverse_cdf(probs, 0.0) == 1
    assert host.inverse_cdf(probs, 0.2499) == 1
    assert host.inverse_cdf(probs, 0.25) == 3
    assert host.inverse_cdf(probs, 1 - 2**-53) == 3
    assert host.inverse_cdf(probs * 3, 1.0) == 3  # u * total rounded up to the total


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sample_by_inversion_follows_the_row_and_skips_tokens_without_mass(dtype):
    """The final token's draw (one uniform, inverted through the row's cumulative sum) follows the row's law: a
    chi-square fit over 20,000 draws of an unnormalised row with zeros, none of which is ever drawn."""
    from specfamily.testing.power import DEFAULT_SIGNIFICANCE
    from specfamily.testing.stats import chi_square

    row = torch.tensor([0.0, 3.0, 0.0, 1e-3, 2.0, 0.5, 0.0, 4.0], dtype=dtype)
    gen = torch.Generator().manual_seed(4)
    counts = torch.bincount(torch.tensor([host.sample(row, gen) for _ in range(20000)]), minlength=8)
    assert counts[row == 0].sum() == 0
    _, p_value, _ = chi_square(counts.double(), (row / row.sum()).double())
    assert p_value >= DEFAULT_SIGNIFICANCE


def test_sample_draws_one_uniform_from_the_generator():
    """One uniform per final token, not one per vocabulary entry: the generator moves as one torch.rand does."""
    row = torch.rand(1000, generator=torch.Generator().manual_seed(0))
    gen, twin = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    host.sample(row, gen)
    torch.rand((), generator=twin, dtype=torch.float64)
    assert torch.equal(gen.get_state(), twin.get_state())


def _whole_row_inverse(probs: torch.Tensor, u: float) -> int:
    """inverse_cdf as it was: one float64 cumsum over the whole row."""
    cdf = probs.double().cumsum(0)
    index = int(torch.searchsorted(cdf, cdf.new_tensor([u * cdf[-1].item()]), right=True))
    return index if index < probs.numel() else int(torch.nonzero(probs).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inverse_cdf_over_the_blocks_with_mass_is_the_whole_rows(dtype):
    """A row of whole blocks is inverted through its blocks with mass only: the same token as the whole row's
    cumsum for every u, on sparse rows (a warped nucleus), rows with mass in the last block and a dense row."""
    gen = torch.Generator().manual_seed(12)
    vocab = 64 * host.BLOCK
    rows = []
    for kept in (1, 3, 17, 200, vocab):
        row = torch.zeros(vocab, dtype=dtype)
        at = torch.randperm(vocab, generator=gen)[:kept]
        row[at] = torch.rand(kept, generator=gen, dtype=torch.float64).to(dtype) ** 4
        rows.append(row)
    last = torch.zeros(vocab, dtype=dtype)
    last[[5, vocab - 1]] = torch.tensor([0.25, 0.75], dtype=dtype)
    rows.append(last)
    us = [0.0, 1 - 2**-53, 0.25, 0.2499999, *torch.rand(300, generator=gen, dtype=torch.float64).tolist()]
    for row in rows:
        assert [host.inverse_cdf(row, u) for u in us] == [_whole_row_inverse(row, u) for u in us]
    assert host.inverse_cdf(last, 1 - 2**-53) == vocab - 1 and host.inverse_cdf(last * 3, 1.0) == vocab - 1


def test_a_batched_passs_host_token_ids_reach_the_device_in_one_copy():
    """to_device: the host tensors (any integer dtype) as long views of one device tensor, one copy for all, queued
    (non-blocking: nothing waits);
    a tensor already on the device and an empty one are handed back as they are; on the CPU nothing moves."""
    host_ids = [torch.tensor([3, 1]), torch.tensor([[7, 8, 9]], dtype=torch.int32), torch.zeros(0, dtype=torch.long)]
    there = on_device(torch.tensor([5]))
    with SyncCounter() as syncs:
        moved = host.to_device([*host_ids, there], STAND_IN)
    assert syncs.count == 0 and [s.kind for s in syncs.queued] == ["copy to device"], syncs.queued
    assert all(t.device == STAND_IN for t in moved[:2]) and moved[2] is host_ids[2] and moved[3] is there
    assert [on_host(t).tolist() for t in moved[:2]] == [[3, 1], [[7, 8, 9]]] and moved[1].dtype == torch.long
    assert all(a is b for a, b in zip(host.to_device(host_ids, torch.device("cpu")), host_ids, strict=True))


def test_a_requests_generator_lives_on_its_device_and_on_the_host_for_the_cpu_and_stand_ins():
    for device in ("cpu", "meta"):
        generator = host.seeded_generator(torch.device(device), 7)
        assert generator.device.type == "cpu" and generator.initial_seed() == 7
