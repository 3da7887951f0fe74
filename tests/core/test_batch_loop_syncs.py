"""Host synchronisations of the batched loop, counted on a stand-in model (specfamily.testing.syncs: its weights
"on an accelerator", the whole pass followed by the counter): a steady pass waits for the host once whatever the
batch size (every request's verdict, in one copy), where slot by slot it waited once a request for its verdict, its
next root, its draft and its moved nodes; what it sends the device (its cache plan, every next root, and where they
are fed its draft ids, a packed pass's row index and the positions of the accepted tree nodes its slots move, one copy
each) is queued, never waited on. The rest are one-time: a request's admission."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

import specfamily as sf
from specfamily.core import batch_loop, host
from specfamily.core.batch_target import BatchTarget
from specfamily.core.target import load_target
from specfamily.testing import RandomTreeDrafter, tiny_model
from specfamily.testing.syncs import SyncCounter, stand_in_module

ONE_TIME = {"target.py", "batch_requests.py", "tree_mask.py", "cache_utils.py"}  # admission, masks, the HF cache


def _prompts(count: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(3, 10, (count,), generator=gen).tolist()
    return [torch.randint(0, 64, (n,), generator=gen).tolist() for n in lengths]


def _run(monkeypatch, drafted: bool, max_batch: int, stand_ins: bool, generation: dict | None = None,
         sampling: sf.SamplingConfig | None = None):
    """(each request's tokens, the syncs of generate_batch by (kind, file), its passes, its slot-passes)."""
    model = tiny_model("llama", 64, 0, torch.float32, spread=1.0)
    for name, value in (generation or {}).items():
        setattr(model.generation_config, name, value)
    fed = []
    forward = BatchTarget.forward
    monkeypatch.setattr(BatchTarget, "forward", lambda self, lo, feeds, *a: fed.append(len(feeds)) or forward(
        self, lo, feeds, *a))
    with SyncCounter() as counted:
        if stand_ins:
            stand_in_module(model)
        target = load_target(model)
        drafter = RandomTreeDrafter(target, gamma=2, nodes=3) if drafted else None
        before = len(counted.syncs)
        results = sf.generate_batch(target, drafter, _prompts(8), 8, sampling=sampling, max_batch=max_batch,
                                    trace=False)
    sites = Counter((s.kind, Path(s.where.rsplit(":", 1)[0]).name) for s in counted.syncs[before:])
    sites.update(("queued " + s.kind, Path(s.where.rsplit(":", 1)[0]).name) for s in counted.queued)
    return [r.tokens for r in results], sites, len(fed), sum(fed)


@pytest.mark.parametrize("drafted", [False, True], ids=["plain", "drafted"])
def test_a_steady_pass_waits_for_the_host_as_often_at_any_batch_size(monkeypatch, drafted):
    for max_batch in (2, 4):
        tokens, sites, passes, _ = _run(monkeypatch, drafted, max_batch, stand_ins=True)
        assert tokens == _run(monkeypatch, drafted, max_batch, stand_ins=False)[0]  # the same decoding
        steady = {site: n for site, n in sites.items() if site[1] not in ONE_TIME and "queued" not in site[0]}
        assert steady == {("copy to host", "host.py"): passes}, (max_batch, sites)  # every request's verdict
        queued = {site[1]: n for site, n in sites.items() if site[0] == "queued copy to device"}  # never waited on
        drafts = queued.pop("host.py", 0)  # the passes' draft ids, one copy a drafted pass
        packed = queued.pop("batch_target.py", 0)  # a packed pass's row index, one copy
        cache = queued.pop("batch_cache.py", 0)  # its plan; the tree paths kept, moved
        assert queued.pop("batch_loop.py") == passes, (max_batch, sites)  # every next root
        assert passes <= cache <= 2 * passes and (cache > passes) == drafted, (max_batch, sites)
        assert (0 < drafts <= passes) if drafted else drafts == 0, (max_batch, sites)
        assert 0 < packed < passes, (max_batch, sites)  # a newcomer's prompt beside the roots; ragged drafts
        assert sites[("copy to device", "target.py")] == 8 and sites[("copy to host", "batch_requests.py")] == 8


def test_a_rule_of_the_requests_own_waits_once_a_request(monkeypatch):
    """Under the target's logits processors each request is verified by its own rule, each verdict a wait: the
    counter sees per-request waits where there are some (the count above is not blind to them)."""
    _, sites, passes, slot_passes = _run(monkeypatch, False, 4, stand_ins=True,
                                          generation={"repetition_penalty": 1.3})
    assert sites[("copy to host", "host.py")] == slot_passes > passes, sites


@pytest.mark.parametrize("drafted", [False, True], ids=["plain", "drafted"])
def test_sampled_walks_on_the_device_reach_the_host_in_one_copy_a_pass(monkeypatch, drafted):
    """Under sampling, with each request's uniforms drawn on the device (as an accelerator's generator draws them),
    every request's walk runs there and their verdicts cross in one copy a pass: the same tokens as each walk
    crossing on its own, which waits once a request."""
    monkeypatch.setattr(host, "draw_device", lambda p, generator: p.device)
    sampling = sf.SamplingConfig(0.8, top_p=0.9)
    tokens, sites, passes, slot_passes = _run(monkeypatch, drafted, 4, stand_ins=True, sampling=sampling)
    assert sites[("copy to host", "host.py")] == passes and sites[("copy to host", "verify.py")] == 0, sites
    monkeypatch.setattr(batch_loop, "walks_on_device", lambda logits, generator: False)  # each request on its own
    alone, each, _, _ = _run(monkeypatch, drafted, 4, stand_ins=True, sampling=sampling)
    assert alone == tokens and each[("copy to host", "verify.py")] == slot_passes > passes, each
