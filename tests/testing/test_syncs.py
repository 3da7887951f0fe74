"""specfamily.testing.syncs: the host synchronisations a piece of code would make on an accelerator, counted on CPU
stand-ins. Each kind the module lists is counted, at the caller's file:line; what does not wait (device arithmetic,
views, in-place writes, non-blocking copies) is not; stand-ins compute exactly what plain CPU tensors compute."""

from __future__ import annotations

import inspect

import pytest
import torch

from specfamily.testing.syncs import (
    STAND_IN,
    StandIn,
    SyncCounter,
    count_syncs,
    on_device,
    on_host,
    stand_in_module,
)


def _x() -> torch.Tensor:
    return on_device(torch.arange(6, dtype=torch.float64))


def test_a_stand_in_reports_the_stand_in_device_and_keeps_its_values():
    x = _x()
    assert isinstance(x, StandIn) and x.device == STAND_IN and x.device.type != "cpu"
    assert torch.equal(on_host(x), torch.arange(6, dtype=torch.float64))
    assert on_device(None) is None and on_device(x) is x


@pytest.mark.parametrize("read", [
    lambda x: x[1].item(), lambda x: bool(x[1] > 0), lambda x: int(x[2]), lambda x: float(x[2]),
    lambda x: torch.arange(6)[x[1].long()],  # a 0-dim tensor used as an index
], ids=["item", "bool", "int", "float", "index"])
def test_reading_a_value_is_one_synchronisation(read):
    x = _x()
    with SyncCounter() as syncs:
        read(x)
    assert [s.kind for s in syncs.syncs] == ["read"], syncs
    assert syncs.syncs[0].op == "aten._local_scalar_dense.default"


@pytest.mark.parametrize("copy", [
    lambda x: x.tolist(), lambda x: x.cpu(), lambda x: x.to("cpu"), lambda x: x.numpy(),
    lambda x: torch.empty(6, dtype=torch.float64).copy_(x),
], ids=["tolist", "cpu", "to-cpu", "numpy", "copy_"])
def test_a_blocking_copy_to_the_host_is_one_synchronisation_and_gives_host_values(copy):
    x = _x()
    with SyncCounter() as syncs:
        out = copy(x)
    assert [s.kind for s in syncs.syncs] == ["copy to host"], syncs
    assert not isinstance(out, StandIn)
    assert list(out) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("copy", [
    lambda x: x.cpu(), lambda x: x.to("cpu"), lambda x: x.to(torch.device("cpu"), torch.float32),
    lambda x: x.to(torch.zeros(1)), lambda x: x.tolist(),
], ids=["cpu", "to-cpu", "to-device-dtype", "to-other", "tolist"])
def test_inference_mode_copies_to_the_host_are_counted_too(copy):
    """Inference mode (every drafter's propose) dispatches ``aten.to`` whole, not as the ``_to_copy`` it makes."""
    x = _x()
    with torch.inference_mode(), SyncCounter() as syncs:
        out = copy(x)
        x.to("cpu", non_blocking=True)
        same = x.to(x.device)
    assert [s.kind for s in syncs.syncs] == ["copy to host"] and [s.kind for s in syncs.queued] == ["copy to host"]
    assert not isinstance(out, StandIn) and list(out) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert same is x


def test_non_blocking_copies_are_queued_not_counted():
    x, host = _x(), torch.empty(6, dtype=torch.float64)
    with SyncCounter() as syncs:
        host.copy_(x, non_blocking=True)
        x.to("cpu", non_blocking=True)
        torch.ones(3).to(x.device, non_blocking=True)
    assert syncs.count == 0 and [s.kind for s in syncs.queued] == ["copy to host"] * 2 + ["copy to device"]


def test_host_operands_that_cuda_copies_to_the_device_with_a_wait():
    x, host_zero_dim = _x(), torch.tensor(7.0, dtype=torch.float64)
    with SyncCounter() as syncs:
        torch.ones(3).to(x.device)  # a blocking host-to-device copy
        x[torch.tensor([0, 2])]  # a host index tensor
        torch.where(x > 2, host_zero_dim, x)  # where moves a 0-dim host operand with .to(device)
    assert [s.kind for s in syncs.syncs] == ["copy to device"] * 3, syncs


def test_data_dependent_shapes():
    x = _x()
    with SyncCounter() as syncs:
        x.nonzero()
        x[x > 2]
        torch.masked_select(x, x > 2)
        torch.unique(x)
        torch.equal(x, x)
    assert [s.kind for s in syncs.syncs] == ["data-dependent shape"] * 5, syncs


def test_device_work_is_not_counted_and_computes_what_the_cpu_computes():
    x, cpu = _x(), torch.arange(6, dtype=torch.float64)
    with SyncCounter() as syncs:
        y = torch.where(x > 2, 3, x) * 2  # a python scalar: made on the device
        y[0] = y[5]  # a write through a view, on the device
        z = y.cumsum(0).div_(2)
        r = torch.rand(3, generator=torch.Generator().manual_seed(0), device=x.device, dtype=torch.float64)
        s = torch.searchsorted(z, r * z[-1])
    assert syncs.count == 0, syncs
    expected = torch.where(cpu > 2, 3, cpu) * 2
    expected[0] = expected[5]
    assert torch.equal(on_host(z), expected.cumsum(0) / 2)
    assert all(isinstance(t, StandIn) for t in (y, z, r, s))
    assert torch.equal(on_host(r), torch.rand(3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))


def test_an_in_place_op_returns_its_operand():
    x = _x()
    with SyncCounter():
        assert x.div_(2) is x
    assert on_host(x)[1] == 0.5


def test_each_synchronisation_names_the_line_that_made_it():
    x = _x()
    with SyncCounter() as syncs:
        x.sum().item()
        x.tolist()
    line = inspect.currentframe().f_lineno - 2  # the line of .item()
    assert [s.where for s in syncs.syncs] == [f"{__file__}:{line}", f"{__file__}:{line + 1}"]
    assert f"read (aten._local_scalar_dense.default) at {__file__}:{line}" in repr(syncs)


def test_count_syncs_returns_the_result_and_the_counter():
    x = _x()
    result, syncs = count_syncs(lambda: x.sum().item())
    assert result == 15.0 and syncs.count == 1


def test_host_tensors_are_the_hosts_own_business():
    """A host tensor's reads cost nothing on the device: parents as drafters give them stay host ints for free."""
    parents = torch.tensor([-1, 0, 1])
    with SyncCounter() as syncs:
        parents.tolist()
        int(parents[1])
        parents.nonzero()
    assert syncs.count == 0


def test_tensors_built_from_host_data_onto_the_device_are_a_blocking_copy():
    x = _x()
    with SyncCounter() as syncs:
        made = [x.new_tensor([1.0]), torch.tensor([1, 2], device=x.device), torch.as_tensor([3.0], device=x.device)]
        same = torch.as_tensor(x)  # already there: no copy
    assert [(s.kind, s.op) for s in syncs.syncs] == [
        ("copy to device", "new_tensor"), ("copy to device", "tensor"), ("copy to device", "as_tensor")], syncs
    assert all(isinstance(t, StandIn) for t in made) and same is x
    assert made[0].dtype == torch.float64 and on_host(made[1]).tolist() == [1, 2]


def test_a_device_tensor_made_outside_the_counters_view_is_refused():
    x, outside = _x(), torch.zeros(6, device=STAND_IN)  # a real meta tensor: no values
    with SyncCounter(), pytest.raises(RuntimeError, match="that is no stand-in"):
        x + outside


def test_a_call_that_changes_nothing_keeps_a_stand_in():
    """``.to`` its own device and dtype and ``.contiguous()`` hand back the tensor itself in C++, which came back
    a bare device tensor the counter then refused (a rotary table moved "to the hidden state's device")."""
    x = _x()
    with SyncCounter() as syncs:
        kept = [x.to(device=x.device, dtype=x.dtype), x.to(x.device), x.contiguous(), x.double()]
        y = kept[0] * 2
    assert all(k is x for k in kept) and isinstance(y, StandIn) and syncs.count == 0


def test_as_tensor_of_a_stand_in_in_its_own_dtype_is_the_stand_in():
    """``torch.as_tensor(ids, dtype=torch.long)`` of long stand-in ids made under inference mode (a Draft of device
    tokens, medusa's) came back a bare device tensor the counter then refused."""
    with SyncCounter() as syncs, torch.inference_mode():
        ids = on_device(torch.tensor([4, 2])) * 1
        same = torch.as_tensor(ids, dtype=torch.long)
        doubled = same.reshape(-1) * 2
    assert same is ids and on_host(doubled).tolist() == [8, 4] and syncs.count == 0


def test_a_view_taken_under_inference_mode_of_a_stand_in_made_outside_it():
    """A drafter's buffer made at its creation, sliced in its ``torch.inference_mode`` proposal (medusa's gather
    index): torch refused the view ("Cannot set version_counter for inference tensor") while stand-ins were
    inference tensors."""
    index = on_device(torch.arange(6))
    with SyncCounter() as syncs, torch.inference_mode():
        part = index[:3]
        picked = on_device(torch.arange(10, 16)).index_select(0, part)
    assert isinstance(part, StandIn) and on_host(picked).tolist() == [10, 11, 12] and syncs.count == 0


def test_a_stand_in_module_runs_its_forward_under_the_counter_as_on_the_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
    stand_in_module(model)
    assert all(isinstance(t, StandIn) for t in [*model.parameters(), *model.buffers()])
    with torch.no_grad(), SyncCounter() as syncs:
        y = model(on_device(x))
        total = float(y.sum())
    assert torch.equal(on_host(y), expected) and syncs.count == 1 and total == float(expected.sum())


@pytest.mark.parametrize(("call", "reads"), [
    (lambda p, g: torch.multinomial(p, 1, generator=g), 2),  # the drafters' draw of one token
    (lambda p, g: torch.multinomial(p, 3, replacement=False, generator=g), 2),
    (lambda p, g: torch.multinomial(p, 3, replacement=True, generator=g), 0),  # checked inside the kernel
    (lambda p, g: torch.searchsorted(p[0], p[1, :3], sorter=p[0].argsort()), 2),
    (lambda p, g: torch.searchsorted(p[0], p[1, :3]), 0),
    (lambda p, g: torch.normal(p, p, generator=g), 1),
    (lambda p, g: torch.normal(0.0, p, generator=g), 1),
    (lambda p, g: torch.normal(p, 1.0, generator=g), 0),
], ids=["multinomial-1", "multinomial-3-without", "multinomial-3-with", "searchsorted-sorter", "searchsorted",
        "normal-tensors", "normal-float-mean", "normal-float-std"])
def test_reads_inside_an_op_are_counted(call, reads):
    """Reads torch makes inside one aten op, below anything a dispatch mode sees (CUDA's kernels share them):
    multinomial's two checks of its probabilities (without replacement or for one sample: Distributions.cpp), the
    sorter's range in searchsorted (BucketizationUtils.h), a tensor std's sign in normal (DistributionTemplates.h)."""
    p = torch.softmax(torch.randn(2, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    with SyncCounter() as syncs:
        out = call(on_device(p), torch.Generator().manual_seed(1))
    assert [s.kind for s in syncs.syncs] == ["read inside an op"] * reads, syncs
    assert torch.equal(on_host(out), call(p, torch.Generator().manual_seed(1)))
