"""Data-parallel training for every trainer: ``torchrun`` ranks under DistributedDataParallel (gloo on CPU, NCCL on
GPU); a single process joins no process group.

- :func:`start` before anything touches a device (it selects ``cuda:LOCAL_RANK`` under torchrun);
- every rank draws the same *global* batch and keeps its own rows (:meth:`Ranks.local`), so N ranks at ``--batch B``
  train like one process at ``--batch N * B``;
- the loss goes through :meth:`Ranks.wrap` (an :class:`Objective` under DDP), so gradients are averaged in backward;
- the wall-clock budget is agreed on (:meth:`Ranks.agree`, the slowest rank's seconds);
- only rank 0 evaluates and writes (:attr:`Ranks.is_main`); the others wait at :meth:`Ranks.barrier`.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specfamily.train.distributed import DistInfo, barrier, env_world, setup, teardown
from specfamily.train.precision import concrete_device


class Objective(nn.Module):
    """``loss_fn(model, *args)`` as a module owning ``model``, so DistributedDataParallel can wrap the whole loss
    (every parameter the loss touches is synchronised, whichever methods of the model it calls)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., Any]) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.loss_fn(self.model, *args, **kwargs)


@dataclass(frozen=True)
class Ranks:
    """This process's place in a data-parallel run (world size 1: a plain single process)."""

    info: DistInfo

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    @property
    def is_main(self) -> bool:
        return self.info.is_main

    @property
    def distributed(self) -> bool:
        return self.info.distributed

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        """``module`` under DistributedDataParallel when distributed (device_ids for CUDA), else as is."""
        if not self.distributed:
            return module
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=ids, output_device=device.index if ids else None)

    def local(self, rows: torch.Tensor | None) -> torch.Tensor | None:
        """This rank's share of a global batch (rows rank * n .. (rank + 1) * n, n = rows / world size)."""
        if rows is None or not self.distributed:
            return rows
        if rows.shape[0] % self.world_size:
            raise ValueError(f"a global batch of {rows.shape[0]} rows does not split over {self.world_size} ranks")
        n = rows.shape[0] // self.world_size
        return rows[self.rank * n : (self.rank + 1) * n]

    def skip_draws(self, generator: torch.Generator, shape: tuple[int, ...] | None, count: int) -> None:
        """Advance ``generator`` past ``count`` uniform draws of ``shape`` (None: nothing is drawn). A rank that
        skips ``rank`` local draws before its own and ``world_size - 1 - rank`` after uses exactly its rows of one
        global draw (CPU generators fill tensors in order), and leaves the generator where one process would."""
        if shape is not None and self.distributed:
            for _ in range(count):
                torch.rand(shape, generator=generator)

    def agree(self, value: float) -> float:
        """The largest ``value`` over the ranks (e.g. elapsed seconds, so every rank stops at the same step)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = torch.tensor([float(value)], dtype=torch.float64, device=self._device())
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return float(box.item())

    def barrier(self) -> None:
        barrier(self.info)

    def close(self) -> None:
        """Leave the process group. Every rank first drops what it no longer holds (a DistributedDataParallel
        wrapper freed after the group is destroyed joins gloo threads that wait on a rank already gone: a hang seen
        in the DDP test) and meets the others, so no rank tears the group down while another still uses it. A rank
        leaving on an exception does not wait (the others may never arrive; torchrun stops them)."""
        if self.distributed and sys.exc_info()[0] is None:
            gc.collect()
            self.barrier()
        teardown(self.info)

    def _device(self) -> torch.device:
        import torch.distributed as dist

        nccl = dist.get_backend() == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def start(device: str) -> Ranks:
    """Join torchrun's process group when launched by it (NCCL for a CUDA ``device``, gloo otherwise; under NCCL
    each rank takes GPU ``LOCAL_RANK``); a single process joins nothing. Call before resolving the device."""
    _, world_size, _ = env_world()
    device = concrete_device(device)
    use_cuda = device.startswith("cuda")
    if world_size > 1 and use_cuda and device != "cuda":
        raise ValueError(f"under torchrun give --device cuda (each rank takes GPU LOCAL_RANK), not {device!r}")
    return Ranks(setup(use_cuda))


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel wrapper (itself otherwise)."""
    return getattr(module, "module", module)
