"""drafters/shared/host_drafts.py: a batched proposal's chains, every slot's tokens and q, reach the host in one
copy (on stand-ins for an accelerator's tensors), each slot's chain as its own."""

import torch

from specfamily.drafters.shared.host_drafts import chain_drafts
from specfamily.testing.syncs import SyncCounter, on_device


def test_every_slots_chain_reaches_the_host_in_one_copy():
    tokens = [[on_device(torch.tensor([t])) for t in steps] for steps in ([4, 7], [9], [1, 2, 3])]
    qs = [[on_device(torch.full((5,), 0.2)) for _ in steps] for steps in tokens]
    qs[1] = []  # a greedy slot: q None
    with SyncCounter() as syncs:
        drafts = chain_drafts(tokens, qs)
    assert syncs.count == 1 and [s.kind for s in syncs.syncs] == ["copy to host"], syncs
    assert [d.tokens.tolist() for d in drafts] == [[4, 7], [9], [1, 2, 3]]
    assert [d.parents.tolist() for d in drafts] == [[-1, 0], [-1], [-1, 0, 1]]
    assert drafts[1].q is None and drafts[2].q.shape == (3, 5) and drafts[0].q.device.type == "cpu"
