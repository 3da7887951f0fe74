"""The batch draft cache kept across proposals (drafters/shared/draft_rows.py): a request's committed pairs are copied
into its row once, stay there across passes, come back exactly when it proposes alone, and its row is free again
when its request ends."""

import gc
import itertools

import pytest
import torch
from transformers import DynamicCache

import specfamily as sf
from specfamily.drafters.eagle.drafter import EagleFamilyDrafter
from specfamily.drafters.shared.draft_rows import FIRST_ROWS, DraftRows
from specfamily.drafters.shared.feature_drafting import FeatureState


def _state(real: int, seed: int, heads: int = 2, dim: int = 3) -> FeatureState:
    generator = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    if real:
        cache.update(torch.randn(1, heads, real, dim, generator=generator),
                     torch.randn(1, heads, real, dim, generator=generator), 0)
    return FeatureState(cache=cache, real=real)


def _pairs(state: FeatureState) -> tuple[torch.Tensor, torch.Tensor]:
    layer = state.cache.layers[0]
    return layer.keys.clone(), layer.values.clone()


def test_adopting_copies_the_pairs_once_and_checking_in_gives_them_back_exactly():
    rows = DraftRows()
    states = [_state(5, 0), _state(0, 1), _state(300, 2)]  # 300 > the first capacity: the buffers grow
    before = [_pairs(s) if s.real else None for s in states]
    assert rows.rows_for(states) == [0, 1, 2]
    assert all(s.held is rows and not s.cache.layers for s in states)  # the row is their cache now
    assert rows.cache.lengths[:3] == [5, 0, 300]
    assert rows.rows_for(states) == [0, 1, 2]  # held: nothing adopted (or copied) again
    copy = FeatureState(real=5, held=rows, row=0)  # a slot copy of states[0]: reads its row, leaves it owned
    rows.check_in(copy)
    assert torch.equal(_pairs(copy)[0], before[0][0]) and rows.owns(states[0]) and copy.held is None
    for state, pairs in zip([states[0], states[2]], [before[0], before[2]], strict=True):
        rows.check_in(state)
        assert state.held is None and state.row == -1
        assert all(torch.equal(a, b) for a, b in zip(_pairs(state), pairs, strict=True))
    assert rows.owners[0] is None and rows.owners[2] is None and rows.owns(states[1])


def test_rows_are_freed_by_release_and_by_a_dead_owner_and_the_pool_doubles_keeping_its_rows():
    rows = DraftRows()
    states = [_state(4, i) for i in range(FIRST_ROWS)]
    rows.rows_for(states)
    rows.release(states[1])
    second = _state(2, 9)
    assert rows.rows_for([second]) == [1]  # the released row
    del states[2]
    gc.collect()
    newcomer = _state(3, 10)
    assert rows.rows_for([newcomer]) == [2]  # its owner is gone
    kept = rows.cache.layers[0].key_buffer[3, :, :4].clone()
    more = [_state(1, 20 + i) for i in range(2)]
    assert rows.rows_for(more) == [FIRST_ROWS, FIRST_ROWS + 1] and rows.cache.slots == 2 * FIRST_ROWS
    assert torch.equal(rows.cache.layers[0].key_buffer[3, :, :4], kept)
    rows.release(second)  # its request ended ...
    with pytest.raises(RuntimeError, match="draft row 1 was released: the state's committed pairs are gone"):
        rows.check_in(FeatureState(real=2, held=rows, row=1))  # ... under a copy still pointing at the row


@pytest.mark.parametrize(("name", "options", "max_batch", "rows"), [
    ("eagle", {"mode": "chain", "gamma": 3}, 3, FIRST_ROWS), ("eagle", {"gamma": 4}, 3, FIRST_ROWS),
    ("eagle3", {"weights": "random", "gamma": 3, "top_k": 4, "total_tokens": 12}, 3, FIRST_ROWS),
    ("eagle", {"mode": "chain", "gamma": 3}, 5, 2 * FIRST_ROWS)])
def test_a_batched_run_adopts_each_request_once_and_frees_its_row_at_the_end(name, options, max_batch, rows,
                                                                             code_target, prompts, monkeypatch):
    """Five requests at max_batch=3 (admissions into retired slots) or 5 (more drafting slots than the pool's first
    rows: it doubles): every drafting request's pairs are copied into the batch draft cache once however many passes
    it drafts, every row is free after the run, and the text is plain batched decoding's."""
    adopted, proposals, serials = [], [], itertools.count()
    adopt, propose_batch = DraftRows.adopt, EagleFamilyDrafter.propose_batch

    def marked(self, state):  # a serial per state: id() is reused once a finished request's state is freed
        adopted.append(vars(state).setdefault("test_serial", next(serials)))
        return adopt(self, state)

    monkeypatch.setattr(DraftRows, "adopt", marked)

    def counted(self, drafters, ctxs, gammas):
        drafts = propose_batch(self, drafters, ctxs, gammas)
        proposals.append(sum(len(d) > 0 for d in drafts))
        return drafts

    monkeypatch.setattr(EagleFamilyDrafter, "propose_batch", counted)
    drafter = sf.create_drafter(name, code_target, policy="constant", **options)
    plain = sf.generate_batch(code_target, None, prompts, max_new_tokens=16, max_batch=max_batch)
    ours = sf.generate_batch(code_target, drafter, prompts, max_new_tokens=16, max_batch=max_batch)
    assert [r.tokens for r in ours] == [r.tokens for r in plain]
    assert sum(proposals) >= 3 * len(prompts)  # requests drafted on many passes ...
    assert len(adopted) == len(set(adopted)) == len(prompts)  # ... each copied into the cache once
    assert drafter.batch_rows.cache.slots == rows
    assert all(ref is None for ref in drafter.batch_rows.owners)  # end() released every row
