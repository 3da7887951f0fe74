"""verify_draft warps only the rows of p that the walk reads, and gets what warping every row would get.

The reference is the verifier as it was: warp all n + 1 rows, then verify_tree. On CPU tensors with a CPU generator
both must return the same path and token and leave the generator in the same state, pass after pass.
"""

from __future__ import annotations

import pytest
import torch

from specfamily.core import acceptance, host
from specfamily.core.acceptance import verify_draft
from specfamily.core.sampling import warp
from specfamily.core.types import Draft, SamplingConfig
from specfamily.core.verify import DraftProbabilityError, verify_tree
from specfamily.testing.syncs import SyncCounter, on_device

CONFIGS = [SamplingConfig(1.0), SamplingConfig(0.7, top_p=0.9), SamplingConfig(1.0, top_k=5),
           SamplingConfig(1.3, top_k=20, top_p=0.8)]


def _warp_all(draft: Draft, logits, sampling, generator):
    return verify_tree(draft.tokens, draft.parents, draft.q, warp(logits, sampling), generator)


def _random_draft(gen: torch.Generator, logits: torch.Tensor, sampling: SamplingConfig, sampled: bool) -> Draft:
    """A random tree whose nodes are drawn from q = warp(the target's logits + a tilt): often accepted, so walks go
    deep; or, unsampled, tokens drawn from the target's p itself (q = None)."""
    n, vocab = logits.shape[0] - 1, logits.shape[1]
    parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)])
    tilted = logits[parents + 1] + 0.5 * torch.randn(n, vocab, generator=gen)
    q = warp(tilted, sampling).double() if sampled else None
    source = q if sampled else warp(logits[parents + 1], sampling).double()
    tokens = torch.multinomial(source, 1, generator=gen).view(-1)
    return Draft(tokens=tokens, parents=parents, q=q)


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "deterministic"])
@pytest.mark.parametrize("sampling", CONFIGS, ids=str)
def test_same_paths_tokens_and_generator_state_as_warping_every_row(sampled, sampling):
    cases = torch.Generator().manual_seed(21)
    depths = []
    for seed in range(60):
        n = int(torch.randint(1, 9, (1,), generator=cases))
        logits = 3 * torch.randn(n + 1, 300, generator=cases)
        draft = _random_draft(cases, logits, sampling, sampled)
        old, new = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(5):  # consecutive passes on one generator stay in step (5: deterministic walks reach depth 3
            # under the final draw by inversion, whose stream differs from torch.multinomial's)
            got = verify_draft(draft, logits, sampling, new)
            assert got == _warp_all(draft, logits, sampling, old)
            depths.append(len(got[0]))
        assert torch.equal(old.get_state(), new.get_state())
    assert max(depths) >= 3  # the comparison reached deep walks


@pytest.mark.parametrize("native", [True, False], ids=["c++ warp", "torch warp"])
def test_only_the_rows_the_walk_reads_are_warped(monkeypatch, native):
    sampling = SamplingConfig(0.7, top_p=0.9)
    if not native:
        monkeypatch.setattr(acceptance, "native_available", lambda: False)
    elif not acceptance.native_available():
        pytest.skip("no warp kernel")
    warped = []

    def counting(logits, config):
        warped.append(logits.shape[0])
        return warp(logits, config)

    monkeypatch.setattr(acceptance, "warp", counting)
    logits = torch.full((5, 10), -10.0)
    logits[:, 3] = 10.0  # p is (almost) one-hot at token 3 in every row
    tree = Draft(tokens=torch.tensor([3, 3, 7, 3]), parents=torch.tensor([-1, 0, 1, 0]), q=None)
    path, _ = verify_draft(tree, logits, sampling, torch.Generator().manual_seed(0))
    assert path == [0, 1]  # token 7 is rejected at depth 3
    assert warped == [1, 1, 1]  # the root's row and the two accepted nodes' rows, once each; not the last two
    warped.clear()
    chain = Draft(tokens=torch.tensor([3, 3, 7, 3]), parents=torch.tensor([-1, 0, 1, 2]), q=None)
    assert verify_draft(chain, logits, sampling, torch.Generator().manual_seed(0))[0] == [0, 1]
    # a chain: the root's row, then each accepted node's alone with the C++ warp; with torch ops, past its accepted
    # first draft the rest in one call
    assert warped == ([1, 1, 1] if native else [1, 4])
    warped.clear()
    rejected = Draft(tokens=torch.tensor([7, 3, 3, 3]), parents=torch.tensor([-1, 0, 1, 2]), q=None)
    assert verify_draft(rejected, logits, sampling, torch.Generator().manual_seed(0))[0] == []
    assert warped == [1]  # rejected at the root: no other row warped


def test_logits_without_n_plus_one_rows_are_refused():
    with pytest.raises(ValueError, match="p must have shape"):
        verify_draft(Draft(tokens=torch.tensor([1]), parents=torch.tensor([-1]), q=None), torch.zeros(3, 4),
                     SamplingConfig(1.0), torch.Generator())


def test_every_slots_greedy_verdict_at_once_is_each_slots_own():
    """verify_greedy_slots (the batched loop's rule at temperature 0) gives, slot for slot, what verify_draft gives:
    random trees drawn from the target's own argmax (deep walks) or at random (rejections), and empty drafts; on
    stand-in device tensors with one host copy for all of them."""
    cases, greedy = torch.Generator().manual_seed(5), SamplingConfig(0.0)
    depths = []
    for _ in range(40):
        drafts, rows = [], []
        for _slot in range(int(torch.randint(1, 6, (1,), generator=cases))):
            n = int(torch.randint(0, 7, (1,), generator=cases))
            logits = 3 * torch.randn(n + 1, 50, generator=cases)
            if n and bool(torch.rand(1, generator=cases) < 0.7):  # every node its parent's argmax: accepted
                parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=cases)) if i else -1
                                        for i in range(n)])
                draft = Draft(logits[parents + 1].argmax(-1), parents)
            else:
                draft = Draft.chain(torch.randint(0, 50, (n,), generator=cases)) if n else Draft.empty()
            drafts.append(draft)
            rows.append(logits)
        expected = [verify_draft(d, r, greedy, torch.Generator()) for d, r in zip(drafts, rows, strict=True)]
        assert acceptance.verify_greedy_slots(drafts, rows) == expected
        depths += [len(path) for path, _ in expected]
        stand_ins = [Draft(on_device(d.tokens), d.parents) for d in drafts]
        with SyncCounter() as syncs:
            got = acceptance.verify_greedy_slots(stand_ins, [on_device(r) for r in rows])
        assert got == expected and syncs.count == 1, syncs
    assert max(depths) >= 4 and min(depths) == 0  # deep walks and rejections both reached


@pytest.mark.parametrize("sampling", CONFIGS[:2], ids=str)
def test_every_slots_sampled_verdict_on_the_device_at_once_is_each_slots_own(monkeypatch, sampling):
    """verify_sampled_slots (the batched loop's rule where the walks run on the device) gives, slot for slot, what
    verify_draft gives with the same generators, and leaves them in the same states: sampled and deterministic
    trees, empty drafts; on stand-in device tensors (uniforms drawn on the stand-in device) with one host copy."""
    monkeypatch.setattr(host, "draw_device", lambda p, generator: p.device)
    cases, depths = torch.Generator().manual_seed(8), []
    for seed in range(12):
        drafts, rows = [], []
        for slot in range(int(torch.randint(2, 6, (1,), generator=cases))):
            n = int(torch.randint(0, 6, (1,), generator=cases))
            logits = 3 * torch.randn(n + 1, 80, generator=cases)
            draft = _random_draft(cases, logits, sampling, sampled=slot % 2 == 0) if n else Draft.empty()
            drafts.append(Draft(on_device(draft.tokens), draft.parents, on_device(draft.q)))
            rows.append(on_device(logits))
        alone = [torch.Generator().manual_seed(seed * 10 + i) for i in range(len(drafts))]
        together = [torch.Generator().manual_seed(seed * 10 + i) for i in range(len(drafts))]
        with SyncCounter() as syncs:
            got = acceptance.verify_sampled_slots(drafts, rows, sampling, together, ["d"] * len(drafts))
        with SyncCounter() as each:  # stand-ins' uniforms are drawn inside a counter's view
            expected = [verify_draft(d, r, sampling, g) for d, r, g in zip(drafts, rows, alone, strict=True)]
        assert syncs.count == 1 and each.count == len(drafts), (syncs, each)
        assert got == expected
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(alone, together, strict=True))
        depths += [len(path) for path, _ in got]
    assert max(depths) >= 3 and min(depths) == 0


def test_a_q_refused_among_a_batchs_walks_is_named_with_its_drafter(monkeypatch):
    monkeypatch.setattr(host, "draw_device", lambda p, generator: p.device)
    good, bad = Draft.chain([1]), Draft.chain([2], q=torch.full((1, 5), 0.5))  # q sums to 2.5
    rows = [on_device(torch.randn(2, 5)) for _ in range(2)]
    with SyncCounter(), pytest.raises(DraftProbabilityError, match=r"^mine: q of draft node 0 is not a distribution"):
        acceptance.verify_sampled_slots([good, bad], rows, SamplingConfig(1.0), [torch.Generator()] * 2,
                                        ["plain", "mine"])
