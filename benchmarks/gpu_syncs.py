"""Host synchronisations per verification pass on a CUDA GPU, each named by its aten op and line (torch.cuda's sync
debug mode, through specfamily.testing.cuda_syncs.CudaSyncOps), beside the CPU stand-in count of the same pass
(SyncCounter). Step 1c of benchmarks/gpu_check.sh; exit status 1 when any pass synchronises more than once. The
first pass also shows the notice torch warns on a process's first set_sync_debug_mode, not counted (session 15's
tests counted it: their "2 a pass" was 1 and the notice, docs/gpu-h200.md).

    python benchmarks/gpu_syncs.py        # from the repository root, on a machine with CUDA
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specfamily.core import host
from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import verify_tree
from specfamily.testing.cuda_syncs import CudaSyncOps
from specfamily.testing.syncs import SyncCounter, on_device

TREE, CHAIN = [-1, -1, 0, 1, 1, 2, 4], [-1, 0, 1, 2, 3, 4, 5]


def counts(on_gpu, on_stand_ins) -> tuple[CudaSyncOps, SyncCounter]:
    """The CUDA call's synchronisations by op (after a warm-up) and the stand-in call's count (uniforms drawn on the
    stand-in device, as an accelerator's generator draws them)."""
    on_gpu()
    with CudaSyncOps() as by_op:
        on_gpu()
    draw_device, host.draw_device = host.draw_device, lambda p, generator: p.device
    try:
        with SyncCounter() as counted:
            on_stand_ins()
    finally:
        host.draw_device = draw_device
    return by_op, counted


def walk_cases(cases: torch.Generator, gen: torch.Generator, device: str = "cuda"):
    """verify_tree as tests/gpu/test_cuda_verify.py calls it: float64 p and q, V 50 and 49152, parents on the host."""
    for vocab in (50, 49152):
        for shape, parents in (("tree", TREE), ("chain", CHAIN)):
            parents = torch.tensor(parents)
            p = torch.softmax(2 * torch.randn(8, vocab, generator=cases, dtype=torch.float64), dim=-1)
            q = torch.softmax(2 * torch.randn(7, vocab, generator=cases, dtype=torch.float64), dim=-1)
            for sampled in (True, False):
                tokens = torch.multinomial(q if sampled else p[parents + 1], 1, generator=cases).view(-1)
                q_used = q if sampled else None
                cuda = (tokens.to(device), parents, None if q_used is None else q_used.to(device), p.to(device))
                standing = (on_device(tokens), parents, on_device(q_used), on_device(p))
                label = f"verify_tree V={vocab} {shape} {'sampled' if sampled else 'deterministic'} float64"
                yield label, lambda c=cuda: verify_tree(*c, gen), lambda s=standing: verify_tree(*s, torch.Generator())


def draft_cases(cases: torch.Generator, gen: torch.Generator, device: str = "cuda"):
    """verify_draft (the loop's rule) on float32 logits, V 49152, sampled and greedy."""
    logits = 3 * torch.randn(8, 49152, generator=cases)
    for name, sampling in (("t0.7-p0.9", SamplingConfig(0.7, top_p=0.9)), ("greedy", SamplingConfig(0.0))):
        q = None if sampling.greedy else warp(logits[:7] + torch.randn(7, 49152, generator=cases), sampling)
        for shape, parents in (("tree", TREE), ("chain", CHAIN)):
            rows = torch.tensor(parents) + 1  # greedy: every node the argmax of its parent's row (all accepted)
            tokens = logits[rows].argmax(-1) if q is None else torch.multinomial(q, 1, generator=cases).view(-1)
            on_gpu = Draft(tokens.to(device), torch.tensor(parents), None if q is None else q.to(device))
            standing = Draft(on_device(tokens), torch.tensor(parents), on_device(q))
            yield (f"verify_draft V=49152 {shape} {name} float32",
                   lambda d=on_gpu, s=sampling: verify_draft(d, logits.to(device), s, gen),
                   lambda d=standing, s=sampling: verify_draft(d, on_device(logits), s, torch.Generator()))


def main(device: str = "cuda") -> int:
    """Every case on ``device`` (CUDA; another device only to test this script's plumbing) and on stand-ins."""
    if device == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available: nothing to count here")
        return 1
    cases, gen, worst = torch.Generator().manual_seed(9), torch.Generator(device=device).manual_seed(0), 0
    for label, on_gpu, on_stand_ins in [*walk_cases(cases, gen, device), *draft_cases(cases, gen, device)]:
        by_op, counted = counts(on_gpu, on_stand_ins)
        worst = max(worst, by_op.count, counted.count)
        where = [f"{s.op} at {Path(s.where).name}" for s in by_op.syncs]
        notices = "".join(f"; not counted: {notice[:80]!r}" for notice in by_op.notices)
        print(f"{label}: {device} {by_op.count} {where}; stand-ins {counted.count}{notices}")
    print(f"syncs per pass: at most {worst} ({device} and stand-ins)")
    return 0 if worst == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
