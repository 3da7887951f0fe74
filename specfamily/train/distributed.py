"""Scale-out over prompt shards with torch.distributed (torchrun): gloo on CPU, nccl on GPU. Prompt i goes to rank
i % world_size, which appends to its own results file; rank 0 merges. A single process needs no process group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch

T = TypeVar("T")
TIMEOUT = timedelta(hours=6)  # ranks wait at the final barrier for the slowest shard


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job; ``owns_group``: this process created the process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def setup(use_cuda: bool) -> DistInfo:
    """Join torchrun's process group (nccl with CUDA, gloo otherwise); world size 1 joins nothing."""
    rank, world_size, local_rank = env_world()
    if world_size <= 1:
        return DistInfo()
    import torch.distributed as dist

    if use_cuda:
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=TIMEOUT)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, owns)


def teardown(info: DistInfo) -> None:
    if info.owns_group:
        import torch.distributed as dist

        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.distributed:
        import torch.distributed as dist

        dist.barrier()


def broadcast(info: DistInfo, value: Any) -> Any:
    """Rank 0's ``value`` on every rank (any picklable object)."""
    if not info.distributed:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shard(items: Sequence[T], info: DistInfo) -> list[T]:
    """This rank's share: items rank, rank + world_size, ..."""
    return list(items[info.rank :: info.world_size])
