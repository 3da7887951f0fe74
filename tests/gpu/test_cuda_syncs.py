"""On CUDA: the CPU-side synchronisation counter (specfamily.testing.syncs.SyncCounter on stand-in tensors) against
torch.cuda's sync debug mode, op by op, and the device walk's synchronisations attributed to the aten op that made
each (CudaSyncOps), beside the stand-in count for the same inputs. tests/testing/test_syncs.py and
tests/core/test_device_verify.py run the CPU side everywhere; this file says whether the two agree on a GPU.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
import torch
from test_cuda_verify import _case, _cuda

import specfamily as sf
import specfamily.core.verify as verify
from specfamily.core import host
from specfamily.core.batch_target import BatchTarget
from specfamily.core.target import load_target
from specfamily.core.verify import verify_tree
from specfamily.testing import tiny_model
from specfamily.testing.cuda_syncs import DEBUG_MODE_NOTICE, CudaSyncOps, debug_mode_syncs, is_sync_warning
from specfamily.testing.syncs import SyncCounter, on_device

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU (torch.cuda.is_available() is False)")]

CATALOGUE = {  # name: fn(x, device) -> anything, x a float64 (6,) tensor on the device. Not here: unique (its CUDA
    # kernel may wait through thrust, which the debug mode does not flag; the counter counts it)
    "item": lambda x, d: x[1].item(),
    "bool": lambda x, d: bool(x[1] > 0),
    "zero-dim index": lambda x, d: torch.arange(6, device=d)[x[1].long()],
    "tolist": lambda x, d: x.tolist(),
    "cpu": lambda x, d: x.cpu(),
    "copy_ to host": lambda x, d: torch.empty(6, dtype=x.dtype).copy_(x),
    "to device": lambda x, d: torch.ones(3).to(d),
    "tensor(data, device)": lambda x, d: torch.tensor([1.0, 2.0], device=d),
    "host index tensor": lambda x, d: x[torch.tensor([0, 2])],
    "where, 0-dim host operand": lambda x, d: torch.where(x > 2, torch.tensor(7.0, dtype=x.dtype), x),
    "nonzero": lambda x, d: x.nonzero(),
    "boolean index": lambda x, d: x[x > 2],
    "arithmetic, views, python scalars": lambda x, d: torch.where(x > 2, 3, x).cumsum(0).div_(2)[1:],
    "write through a view": lambda x, d: x.clone().__setitem__(0, x[5]),
    "searchsorted, argmax, cat": lambda x, d: torch.cat([torch.searchsorted(x, x[2:3]), x.argmax().view(1)]),
    # reads inside one op (the counter's "read inside an op"): 2, 2, 0, 2, 1
    "multinomial, one sample": lambda x, d: torch.multinomial(x + 1, 1),
    "multinomial without replacement": lambda x, d: torch.multinomial(x + 1, 3),
    "multinomial with replacement": lambda x, d: torch.multinomial(x + 1, 3, replacement=True),
    "searchsorted with a sorter": lambda x, d: torch.searchsorted(x, x[2:3], sorter=torch.arange(6, device=d)),
    "normal, tensor std": lambda x, d: torch.normal(x, x + 1),
}


def _debug_mode_count(fn) -> int:
    return len(debug_mode_syncs(fn)[1])


FRESH_PROCESS = """
import warnings

import torch

x = torch.ones(2, device="cuda")
torch.cuda.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    x[0].item()
    torch.cuda.set_sync_debug_mode("default")
print(repr([str(w.message) for w in caught]))
"""


def test_the_first_count_in_a_fresh_process_sees_one_synchronisation_for_one_item():
    """Session 15 counted 2 a pass in a pass that makes 1: in a fresh process, one .item() under the debug mode
    warns the flagged call and the notice of the process's first switch, whose text also says "synchronizing".
    Only the flagged call counts (specfamily.testing.syncs.is_sync_warning); the messages print when this fails."""
    run = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    messages = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    assert sum(map(is_sync_warning, messages)) == 1, messages
    notices = [m for m in messages if "synchronizing" in m and not is_sync_warning(m)]
    assert all(m.startswith(DEBUG_MODE_NOTICE) for m in notices), messages  # what the old filter took for a sync


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_the_stand_in_count_is_the_debug_modes_count(name):
    fn, x = CATALOGUE[name], torch.arange(6, dtype=torch.float64)
    cuda_x = x.cuda()
    fn(cuda_x, cuda_x.device)  # warm-up
    on_gpu = _debug_mode_count(lambda: fn(cuda_x, cuda_x.device))
    with CudaSyncOps() as by_op:
        fn(cuda_x, cuda_x.device)
    stand_in = on_device(x.clone())
    with SyncCounter() as counted:
        fn(stand_in, stand_in.device)
    assert (counted.count, by_op.count) == (on_gpu, on_gpu), (name, counted, by_op)


@pytest.mark.parametrize("chain", [False, True], ids=["tree", "chain"])
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_the_device_walks_synchronisations_by_aten_op(monkeypatch, chain, sampled):
    """tests/gpu/test_cuda_verify.py's cases, every synchronisation named by its aten op and line (CUDA) beside the
    stand-in count of the same pass; both must be the result's one copy."""
    cases, gen = torch.Generator().manual_seed(9), torch.Generator(device="cuda").manual_seed(0)
    for _ in range(5):
        tokens, parents, q, p = _case(cases, chain, sampled)
        cuda_args = (tokens.cuda(), parents, _cuda(q), p.cuda())
        verify_tree(*cuda_args, gen)  # warm-up
        with CudaSyncOps() as by_op:
            verify_tree(*cuda_args, gen)
        with monkeypatch.context() as patch:
            patch.setattr(host, "draw_device", lambda p, generator: p.device)  # the uniforms drawn on the device
            with SyncCounter() as counted:
                verify_tree(on_device(tokens), parents, on_device(q), on_device(p), torch.Generator().manual_seed(0))
        assert counted.count == 1, counted
        assert by_op.count == 1 and by_op.syncs[0].where.startswith(verify.__file__), by_op


def test_a_batched_pass_synchronises_as_often_at_any_batch_size_on_cuda(monkeypatch):
    """tests/core/test_batch_loop_syncs.py's count on stand-ins, under torch.cuda's own debug mode: plain batched greedy
    decoding of 8 requests at max_batch 2 and 4 waits for the host about as often per pass at either batch size
    (once a pass: the verdicts; what a pass sends the device is queued; plus each request's admission), where slot
    by slot the waits grew with the batch."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(3, 10, (8,), generator=gen).tolist()
    prompts = [torch.randint(0, 64, (n,), generator=gen).tolist() for n in lengths]
    per_pass = {}
    for max_batch in (2, 4):
        target = load_target(tiny_model("llama", 64, 0, torch.float32, spread=1.0).to("cuda"))
        fed = []
        forward = BatchTarget.forward
        monkeypatch.setattr(BatchTarget, "forward", lambda self, lo, feeds, *a, f=forward, fed=fed: fed.append(
            len(feeds)) or f(self, lo, feeds, *a))
        sf.generate_batch(target, None, prompts, 8, max_batch=max_batch, trace=False)  # warm-up
        fed.clear()
        _, where = debug_mode_syncs(lambda t=target, b=max_batch: sf.generate_batch(t, None, prompts, 8, max_batch=b,
                                                                                    trace=False))
        per_pass[max_batch] = (len(where) - 2 * len(prompts)) / len(fed)  # less each request's admission
        print(max_batch, len(fed), len(where), where)
        monkeypatch.undo()
    # stand-ins read 1.0 a pass at either batch size once admissions are taken out (session 41; 3.7 and 4.25 before
    # the pass's copies to the device were queued); slot by slot each pass waited twice more a request
    assert per_pass[4] <= per_pass[2] + 1 and per_pass[4] <= 4, per_pass


@pytest.mark.parametrize("batched", [False, True], ids=["batch-1", "batched"])
def test_an_eagle_tree_proposal_waits_once_on_cuda(batched, monkeypatch):
    """tests/drafters/shared/test_lockstep_tree.py's count under torch.cuda's own debug mode: an EAGLE-2 top-k tree
    proposal (random weights, tiny target on the GPU) waits for the host once, for its kept trees, at batch 1 and in
    a batched pass of 4 requests (grow_tree waited 13 times a proposal on stand-ins)."""
    from specfamily.drafters.eagle import drafter as eagle_drafter
    from specfamily.drafters.shared.feature_drafting import FeatureDrafter

    target = load_target(tiny_model("llama", 64, 0, torch.float32, spread=1.0).to("cuda"))
    drafter = sf.create_drafter("eagle", target, weights="random", gamma=4, top_k=3, total_tokens=8)
    waits = []
    if batched:
        propose = eagle_drafter.propose_feature_batch
        monkeypatch.setattr(eagle_drafter, "propose_feature_batch", lambda *a: waits.append(
            debug_mode_syncs(lambda: propose(*a))) or waits[-1][0])
    else:
        tree = FeatureDrafter._tree
        monkeypatch.setattr(FeatureDrafter, "_tree", lambda *a: waits.append(
            debug_mode_syncs(lambda: tree(*a))) or waits[-1][0])
    prompts = [[3, 17, 9, 40, 2], [8, 1, 5], [22, 4, 61, 7], [9, 9, 30]]
    if batched:
        sf.generate_batch(target, drafter, prompts, 12, max_batch=4, trace=False)
    else:
        sf.generate(target, drafter, prompts[0], 12)
    drafted = [where for drafts, where in waits if not isinstance(drafts, list) or any(len(d) for d in drafts)]
    print([len(where) for where in drafted], drafted[:2])
    assert len(drafted) >= 3 and all(len(where) == 1 for where in drafted), drafted
